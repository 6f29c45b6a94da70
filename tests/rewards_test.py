import numpy as np
import pytest

from skilljax import rewards
from skilljax.envs.base import Task
from skilljax.rl.rollout import RolloutResult, StepSample, Trajectory


def sample(episode, valid):
    return StepSample([1], [2], np.zeros(1), episode, 0, 0, "a", valid, "", 0.0, False, {})


def test_scores_by_hand():
    task = Task("t", "x", "train", {})
    trajs = [Trajectory(task, 0, 0, rewards=[0.0, 10.0]), Trajectory(task, 0, 0, rewards=[0.0])]
    samples = [sample(0, True), sample(0, False), sample(1, False)]
    res = RolloutResult(samples, trajs, {})
    np.testing.assert_allclose(rewards.trajectory_rewards(res), [10.0, 0.0])
    np.testing.assert_allclose(rewards.sample_scores(res, invalid_penalty=0.1), [10.0, 9.9, -0.1])
    bonus = lambda t: -0.5 * len(t.rewards)  # an extra trajectory term composes additively
    np.testing.assert_allclose(rewards.sample_scores(res, 0.0, [bonus]), [9.0, 9.0, -0.5])


def test_segmentation_term_penalises_successes_by_their_segment_count():
    """ReuseRL: −λ·seg(φ(τ), C)/T on successes under the current dictionary, 0 on failures."""
    from skilljax.skills.segmentation import SegmentationConfig, SegmentationCost
    task = Task("t", "heat", "train", {})
    won = Trajectory(task, 0, 0, actions=["take egg", "use heater", "put egg in desk"],
                     rewards=[0.0, 0.0, 10.0], won=True)
    lost = Trajectory(task, 0, 0, actions=["take egg", "jump"], rewards=[0.0, 0.0])
    res = RolloutResult([sample(0, True), sample(0, True), sample(0, True), sample(1, True),
                         sample(1, False)], [won, lost], {})
    cost = SegmentationCost(SegmentationConfig(mode="segcost", horizon=10, alphabet=()))
    cost.dictionary |= {("take", "process")}        # φ: take, process, put → 2 segments
    term = rewards.segmentation_term(cost, "chores")
    assert term(won) == -10.0 * 2 / 10 and term(lost) == 0.0
    np.testing.assert_allclose(rewards.sample_scores(res, 0.1, [term]), [8, 8, 8, 0, -0.1])
    length = SegmentationCost(SegmentationConfig(mode="length", horizon=10))
    assert rewards.segmentation_term(length, "chores")(won) == -3.0   # −λ·|s|/T


def test_step_scores_feed_every_estimator_as_the_direct_calls():
    """`rewards.step_scores` → `losses.advantages(kind)` equals the estimators called by hand on
    the same rollout (GRPO family over trajectories or steps; GiGPO with its step groups)."""
    from skilljax.rl import losses
    task = Task("t", "x", "train", {})
    # Group 0: episode 0 wins at its 2nd step; episode 1 fails, one invalid step. Group 1: one
    # episode that wins at once.
    trajs = [Trajectory(task, 0, 0, rewards=[0.0, 10.0]), Trajectory(task, 0, 0, rewards=[0.0, 0.0]),
             Trajectory(task, 0, 0, rewards=[10.0])]
    mk = lambda ep, grp, step, valid, r, anchor: StepSample(
        [1], [2], np.zeros(1), ep, grp, step, "a", valid, "", r, False, {}, anchor)
    samples = [mk(0, 0, 0, True, 0.0, "A"), mk(0, 0, 1, True, 10.0, "B"),
               mk(1, 0, 0, False, 0.0, "A"), mk(1, 0, 1, True, 0.0, "C"),
               mk(2, 1, 0, True, 10.0, "A")]
    res = RolloutResult(samples, trajs, {})
    x = rewards.step_scores(res, 0.1)
    np.testing.assert_allclose(x.scores, rewards.sample_scores(res, 0.1))
    np.testing.assert_allclose(x.trajectory_scores, [10, 10, 0, 0, 10])
    np.testing.assert_allclose(x.step_rewards, [0, 10, -0.1, 0, 10])
    groups, trajs_ids = [0, 0, 0, 0, 1], [0, 0, 1, 1, 2]
    for kind in ("grpo", "drgrpo", "rloo"):
        for stats, t in (("trajectory", trajs_ids), ("step", None)):
            np.testing.assert_array_equal(
                losses.advantages(kind, x, losses.AdvantageConfig(group_stats=stats)),
                losses.group_advantages(x.scores, groups, kind, traj_ids=t))
    cfg = losses.AdvantageConfig(gigpo_gamma=0.9, gigpo_mode="mean_std_norm",
                                 gigpo_step_weight=0.5)
    np.testing.assert_array_equal(
        losses.advantages("gigpo", x, cfg),
        losses.gigpo_advantages([10, 10, 0, 0, 10], [0, 10, -0.1, 0, 10], groups, trajs_ids,
                                [0, 1, 0, 1, 0], ["A", "B", "A", "C", "A"], gamma=0.9,
                                mode="mean_std_norm", step_weight=0.5))
    with pytest.raises(ValueError, match="rl.advantage='ppo'; choose one of"):
        losses.advantages("ppo", x)
    with pytest.raises(ValueError, match="rl.group_stats='episode'"):
        losses.AdvantageConfig(group_stats="episode")


@pytest.mark.parametrize("r1,r2,from_q1,used,has_code,want", [
    (1, 1, True, True, (True, True), (2.0, 2.0)),     # task 2 reused task 1's function
    (1, 1, False, True, (True, True), (1.0, 2.0)),    # task 2 used a skill, not task 1's
    (1, 1, False, False, (True, True), (1.0, 1.0)),
    (1, 0, True, True, (True, True), (1.0, 0.0)),     # reuse that failed credits nobody
    (0, 1, True, True, (True, True), (0.0, 2.0)),     # task 1 failed: no credit for it
    (0, 0, False, False, (True, True), (0.0, 0.0)),
    (1, 1, True, True, (False, True), (-1.0, 2.0)),   # no code in a response: −1
    (1, 1, True, True, (True, False), (2.0, -1.0)),
])
def test_chain_rewards_table(r1, r2, from_q1, used, has_code, want):
    assert rewards.chain_rewards(r1, r2, from_q1, used, has_code) == want


def test_chain_rewards_rejects_non_binary_outcomes():
    with pytest.raises(ValueError, match="0 or 1"):
        rewards.chain_rewards(10.0, 1, True, True)


def test_compression_tag_parsing():
    """SKILL0's <compression> projection: clamp to [1, 5], missing or unreadable → 1.0 (valid),
    more than one tag → 1.0 and invalid, forced to 1.0 on an answer."""
    from skilljax.rl.rollout import parse_compression
    cases = [
        ("<action>go</action><compression>2.5</compression>", (2.5, True)),
        ("<COMPRESSION> 3 </Compression>", (3.0, True)),
        ("<compression>9</compression>", (5.0, True)),
        ("<compression>0.2</compression>", (1.0, True)),
        ("<compression>-4</compression>", (1.0, True)),
        ("no tag at all", (1.0, True)),
        ("<compression>lots</compression>", (1.0, True)),
        ("<compression>nan</compression>", (1.0, True)),
        ("<compression>inf</compression>", (1.0, True)),
        ("<compression>2</compression><compression>3</compression>", (1.0, False)),
        ("<compression>2</compression></compression>", (1.0, False)),
        ("<compression>2", (1.0, True)),
    ]
    for text, want in cases:
        assert parse_compression(text) == want, text
    assert parse_compression("<answer>x</answer><compression>4</compression>", answer=True) == (1.0, True)


def test_compression_bonus_by_hand():
    """coef·ln(cf) on the steps of successful trajectories, −failure_coef·ln(cf) on failed ones,
    every n-th step; added to that step's score as the invalid penalty is subtracted."""
    import dataclasses
    task = Task("t", "x", "train", {})
    trajs = [Trajectory(task, 0, 0, rewards=[0.0, 10.0], won=True),
             Trajectory(task, 0, 0, rewards=[0.0])]
    samples = [dataclasses.replace(sample(0, True), compression=2.0),
               dataclasses.replace(sample(0, False), compression=1.0),
               dataclasses.replace(sample(1, True), compression=4.0)]
    res = RolloutResult(samples, trajs, {})
    np.testing.assert_allclose(rewards.compression_bonus(res, 0.01),
                               [0.01 * np.log(2), 0.0, 0.0])
    np.testing.assert_allclose(rewards.compression_bonus(res, 0.01, failure_coef=0.1),
                               [0.01 * np.log(2), 0.0, -0.1 * np.log(4)])
    x = rewards.step_scores(res, 0.1, step_bonus=rewards.compression_bonus(res, 0.01))
    np.testing.assert_allclose(x.scores, [10 + 0.01 * np.log(2), 9.9, 0.0])
    np.testing.assert_allclose(x.trajectory_scores, [10, 10, 0])
    assert [rewards.compression_due(s, 8) for s in (1, 7, 8, 15, 16)] == [False] * 2 + [True, False, True]
    assert not rewards.compression_due(8, 0)
