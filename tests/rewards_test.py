import numpy as np

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
