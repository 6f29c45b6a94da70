"""Advantage estimators and losses against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skilljax.rl import losses

S3 = np.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]


@pytest.mark.parametrize("kind,expected", [
    ("grpo", [0.5 / S3, -0.5 / S3, -0.5 / S3, 0.5 / S3, 5.0]),
    ("drgrpo", [0.5, -0.5, -0.5, 0.5, 5.0]),
    ("rloo", [2 / 3, -2 / 3, -2 / 3, 2 / 3, 5.0]),
])
def test_group_advantages_by_hand(kind, expected):
    # Group "a" has four members; group "b" one (baseline 0, std 1, as in the reference code).
    adv = losses.group_advantages([1, 0, 0, 1, 5], ["a", "a", "a", "a", "b"], kind, eps=0.0)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_zero_variance_group_has_zero_advantage():
    np.testing.assert_array_equal(losses.group_advantages([2, 2, 2], [7, 7, 7]), [0, 0, 0])


def test_statistics_over_steps_or_trajectories():
    # Trajectory t1 (3 steps, score 1) and t2 (1 step, score 0) in one group.
    scores, groups, trajs = [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 2]
    cross = losses.group_advantages(scores, groups, eps=0.0)
    np.testing.assert_allclose(cross, [0.5, 0.5, 0.5, -1.5], rtol=1e-6)  # mean .75, std .5
    per_traj = losses.group_advantages(scores, groups, eps=0.0, traj_ids=trajs)
    np.testing.assert_allclose(per_traj, [2 ** -0.5] * 3 + [-2 ** -0.5], rtol=1e-6)
    rloo = losses.group_advantages(scores, groups, "rloo", traj_ids=trajs)
    np.testing.assert_allclose(rloo, [1, 1, 1, -1], rtol=1e-6)


def all_failed_group(n_traj=8, steps=50, penalised=(3, 17), penalty=0.1):
    """Scores of a group whose trajectories all failed; one step of one trajectory is invalid."""
    scores = np.zeros(n_traj * steps)
    scores[penalised[0] * steps + penalised[1]] = -penalty
    return scores, np.zeros(n_traj * steps, int), np.repeat(np.arange(n_traj), steps)


def test_step_penalty_keeps_its_scale_with_trajectory_statistics():
    # The defect: statistics over trajectory means, numerator per step: A ≈ −141 for the penalised
    # step. Eq. 5: every trajectory scores 0, so only the penalty remains, unscaled.
    scores, groups, trajs = all_failed_group()
    for kind in ("grpo", "drgrpo", "rloo"):
        adv = np.asarray(losses.group_advantages(scores, groups, kind, traj_ids=trajs))
        expected = np.zeros_like(scores)
        expected[3 * 50 + 17] = -0.1
        np.testing.assert_allclose(adv, expected, atol=1e-6)
    # The released definition (no traj_ids): one outlier among n = 400 is (n − 1)/√n = 19.95
    # standard deviations away, the others 1/√n.
    adv = np.asarray(losses.group_advantages(scores, groups, eps=0.0))
    assert adv[3 * 50 + 17] == pytest.approx(-19.95, rel=1e-5)
    assert np.allclose(np.delete(adv, 3 * 50 + 17), 0.05, rtol=1e-5)


def test_trajectory_statistics_by_hand():
    # t1 won (10) with one invalid step (−0.1); t2 failed with an invalid last step. R = {10, 0}:
    # z = ±1/√2 (unbiased std √50); each step adds its own penalty.
    scores = [10, 9.9, 0, 0, -0.1]
    adv = losses.group_advantages(scores, [0] * 5, eps=0.0, traj_ids=[1, 1, 2, 2, 2])
    z = 2 ** -0.5
    np.testing.assert_allclose(adv, [z, z - 0.1, -z, -z, -z - 0.1], rtol=1e-6)
    adv = losses.group_advantages(scores, [0] * 5, "drgrpo", traj_ids=[1, 1, 2, 2, 2])
    np.testing.assert_allclose(adv, [5, 4.9, -5, -5, -5.1], rtol=1e-6)


@pytest.mark.parametrize("with_trajectories", [False, True])
def test_advantages_are_bounded_by_the_group_size(with_trajectories):
    """|A| ≤ √(samples in the group): a z-score over n values is at most (n − 1)/√n, and eq. 5's
    per-step term is a penalty (0.1 here, ALFWorld's)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_groups, scale = rng.integers(1, 4), 10.0 ** rng.uniform(-3, 3)
        groups, trajs, scores = [], [], []
        for g in range(n_groups):
            for t in range(rng.integers(2, 9)):
                steps = rng.integers(1, 30)
                reward = scale * rng.choice([0.0, 1.0]) if rng.random() < 0.8 else scale * rng.random()
                penalty = 0.1 * (rng.random(steps) < rng.uniform(0, 0.5))
                groups += [g] * steps
                trajs += [t] * steps
                scores += list(reward - penalty) if with_trajectories else list(
                    scale * rng.normal(size=steps))
        adv = np.asarray(losses.group_advantages(scores, groups, "grpo",
                                                 traj_ids=trajs if with_trajectories else None))
        size = np.bincount(groups)[groups]
        assert np.all(np.abs(adv) <= np.sqrt(size) + 1e-3)


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="Unknown advantage kind 'ppo'"):
        losses.group_advantages([1.0], [0], "ppo")


def gigpo_case(anchors_t2, gamma=1.0, mode="mean_norm"):
    # Task group g: t1 succeeds at its 2nd step (reward 10), t2 fails in 3 steps.
    return losses.gigpo_advantages(
        episode_scores=[10, 10, 0, 0, 0], step_rewards=[0, 10, 0, 0, 0], group_ids=["g"] * 5,
        traj_ids=[1, 1, 2, 2, 2], step_index=[0, 1, 0, 1, 2], anchors=["A", "B", *anchors_t2],
        gamma=gamma, mode=mode, eps=0.0)


def test_gigpo_by_hand():
    # Episode (mean_norm): ±5. Step groups: A = {10, 0} → ±5, B = {10, 0} → ±5, C = {0} → 0.
    np.testing.assert_allclose(gigpo_case(["A", "C", "B"]), [10, 10, -10, -5, -10], rtol=1e-6)
    # γ = 0.5: t1's first step returns 5, so A = {5, 0} → ±2.5.
    np.testing.assert_allclose(gigpo_case(["A", "C", "B"], gamma=0.5),
                               [7.5, 10, -7.5, -5, -10], rtol=1e-6)


def test_gigpo_state_seen_once_has_no_step_advantage():
    # t1 wins at its 2nd step in state B, which no other rollout saw; t2 fails through A then C.
    # Episode ±5; step group A = {10, 0} → ±5; B and C are singletons → 0 (the reference's own
    # mean), so t1's winning step gets +5, not the raw return 10 on top (+15).
    adv = losses.gigpo_advantages(
        episode_scores=[10, 10, 0, 0], step_rewards=[0, 10, 0, 0], group_ids=["g"] * 4,
        traj_ids=[1, 1, 2, 2], step_index=[0, 1, 0, 1], anchors=["A", "B", "A", "C"], eps=0.0)
    np.testing.assert_allclose(adv, [10, 5, -10, -5], rtol=1e-6)
    adv = losses.gigpo_advantages(
        episode_scores=[10, 10, 0, 0], step_rewards=[0, 10, 0, 0], group_ids=["g"] * 4,
        traj_ids=[1, 1, 2, 2], step_index=[0, 1, 0, 1], anchors=["A", "B", "A", "C"], eps=0.0,
        mode="mean_std_norm")
    z = 2 ** -0.5
    np.testing.assert_allclose(adv, [2 * z, z, -2 * z, -z], rtol=1e-6)


def test_gigpo_repeated_anchor_states():
    # t2 sees state A twice: step group A = {10, 0, 0}, mean 10/3.
    adv = gigpo_case(["A", "A", "B"])
    np.testing.assert_allclose(adv, [5 + 20 / 3, 10, -5 - 10 / 3, -5 - 10 / 3, -10], rtol=1e-6)
    # mean_std_norm: episode ±1/√2 (std of {10, 0} is √50); A: std of {10, 0, 0} = √(100/3).
    adv = gigpo_case(["A", "A", "B"], mode="mean_std_norm")
    s_a = np.sqrt(100 / 3)
    np.testing.assert_allclose(adv, [2 ** -0.5 + (20 / 3) / s_a, 2 ** -0.5 + 2 ** -0.5,
                                     -2 ** -0.5 - (10 / 3) / s_a, -2 ** -0.5 - (10 / 3) / s_a,
                                     -2 ** -0.5 - 2 ** -0.5], rtol=1e-6)


def test_discounted_returns_any_order():
    r = losses.discounted_returns([1, 2, 3, 5], traj_ids=[0, 0, 0, 1], step_index=[2, 0, 1, 0],
                                  gamma=0.5)
    # Trajectory 0 in step order is [2, 3, 1]: returns [2 + .5·3 + .25·1, 3 + .5·1, 1].
    np.testing.assert_allclose(r, [1, 3.75, 3.5, 5])


# Ratios [[1.5, 0.5], [1, 4]], advantages [1, -1].
LOGP = np.log([[1.5, 0.5], [1.0, 4.0]])
OLD = np.zeros((2, 2))
ADV = np.array([1.0, -1.0])


@pytest.mark.parametrize("agg,expected", [("token-mean", (-1.2 - 0.5 + 1) / 3),
                                          ("seq-mean-token-mean", (-0.85 + 1) / 2),
                                          ("seq-mean-token-sum", (-1.7 + 1) / 2)])
def test_policy_loss_by_hand(agg, expected):
    # Row 0, A=1: ratio 1.5 clips to 1.2 (loss −1.2), ratio .5 keeps −.5. Row 1, A=−1: ratio 1 → 1.
    loss, metrics = losses.policy_loss(LOGP, OLD, ADV, [[1, 1], [1, 0]], agg=agg)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["clip_frac"]) == pytest.approx(1 / 3)


def test_dual_clip_on_negative_advantage():
    mask = np.ones((2, 2))
    plain, _ = losses.policy_loss(LOGP, OLD, ADV, mask)
    dual, m = losses.policy_loss(LOGP, OLD, ADV, mask, dual_clip=3.0)
    # Row 1, ratio 4, A = −1: clipped surrogate gives 4; dual-clip bounds it at 3.
    assert float(plain) == pytest.approx((-1.2 - 0.5 + 1 + 4) / 4)
    assert float(dual) == pytest.approx((-1.2 - 0.5 + 1 + 3) / 4)
    assert float(m["dual_clip_frac"]) == pytest.approx(1 / 4)
    # Positive advantages are never dual-clipped: row 0 unchanged with any c.
    big, _ = losses.policy_loss(LOGP[:1], OLD[:1], ADV[:1], mask[:1], dual_clip=1.5)
    assert float(big) == pytest.approx((-1.2 - 0.5) / 2)


def test_clip_higher():
    loss, m = losses.policy_loss(LOGP[:1], OLD[:1], ADV[:1], np.ones((1, 2)), clip_high=0.28)
    assert float(loss) == pytest.approx((-1.28 - 0.5) / 2) and float(m["clip_frac"]) == 0.5


@pytest.mark.parametrize("agg", losses.AGGREGATIONS)
def test_micro_batch_sums_reproduce_full_batch(agg):
    rng = np.random.default_rng(0)
    logp, old = rng.normal(-2, 0.3, (8, 6)), rng.normal(-2, 0.3, (8, 6))
    adv, mask = rng.normal(size=8), (rng.random((8, 6)) < 0.7)
    full, _ = losses.policy_loss(logp, old, adv, mask, agg=agg)
    parts = [losses.policy_loss_terms(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                                      agg=agg) for i in range(0, 8, 2)]
    num, den = sum(p[0] for p in parts), sum(p[1] for p in parts)
    assert float(num / den) == pytest.approx(float(full), rel=1e-6)


def test_kl_estimators_by_hand():
    logp, ref = np.log([0.5, 0.25]), np.log([0.25, 0.5])
    d = np.log([2.0, 0.5])
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k1"), d, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k2"), 0.5 * d ** 2, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), [0.5 - 1 + d[0], 2 - 1 + d[1]],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        losses.kl_penalty(logp, ref, "k4")


def _expected_loss_grad(kind, theta, ref_logp):
    """∇θ of E_{x~π_θ}[kl(x)] with the samples held fixed (what a loss term's gradient is)."""
    probs = jax.nn.softmax(theta)

    def surrogate(t):
        logp = jax.nn.log_softmax(t)
        return jnp.sum(jax.lax.stop_gradient(probs) * losses.kl_penalty(logp, ref_logp, kind))
    return jax.grad(surrogate)(theta)


def test_k1_loss_gradient_vanishes_and_k3_matches_finite_differences():
    theta = jnp.array([0.3, -1.2, 0.8, 0.1, -0.4])
    ref_logp = jax.nn.log_softmax(jnp.array([0.0, 0.5, -0.5, 1.0, 0.2]))
    np.testing.assert_allclose(_expected_loss_grad("k1", theta, ref_logp), 0.0, atol=1e-7)
    # k3 as a loss term pushes π towards π_ref: its expected gradient is ∇θ KL(π_ref ‖ π_θ).
    g = np.asarray(_expected_loss_grad("k3", theta, ref_logp))
    assert np.abs(g).max() > 1e-2

    def reverse_kl(t):
        return float(jnp.sum(jnp.exp(ref_logp) * (ref_logp - jax.nn.log_softmax(t))))
    h = 1e-3
    fd = [(reverse_kl(theta.at[i].add(h)) - reverse_kl(theta.at[i].add(-h))) / (2 * h)
          for i in range(len(theta))]
    np.testing.assert_allclose(g, fd, atol=1e-4)


def test_k3_is_unbiased_for_kl():
    rng = np.random.default_rng(0)
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    x = rng.choice(3, size=200_000, p=p)
    k3 = np.asarray(losses.kl_penalty(np.log(p[x]), np.log(q[x]), "k3"))
    assert k3.min() >= 0
    assert k3.mean() == pytest.approx(float(np.sum(p * np.log(p / q))), rel=0.02)


def test_entropy_from_logits():
    ent = losses.entropy_from_logits(jnp.log(jnp.array([[[0.5, 0.5, 0.0 + 1e-30]]])))
    assert float(ent[0, 0]) == pytest.approx(np.log(2), rel=1e-5)
