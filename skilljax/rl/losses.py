"""Advantage estimators, the clipped policy loss and KL estimators: small pure functions by name.

Where each comes from:
- `group_advantages`, kind "grpo": Â = (r − mean_G r) / (std_G r + ε), the group-relative advantage
  of GRPO as used by SKILL0 (paper eq. 5; std unbiased, ε = 1e-6 as in the released code).
  "drgrpo" drops the std (Dr. GRPO); "rloo" uses the leave-one-out mean of the other members.
  Two definitions, chosen by whether `traj_ids` is given (see `group_advantages`): without, the
  statistics and the numerator run over all step samples of a group, as the released SKILL0 code
  does (`compute_mean_std_cross_steps=True`); with, eq. 5 proper: one score per trajectory in the
  numerator and the statistics, each step's own penalty added after normalisation. A group with
  one member has baseline 0 (and std 1), as in the reference code.
- `gigpo_advantages`: GiGPO (arXiv 2505.10978) — episode advantage within the task group plus
  ω × step advantage within "anchor state" groups (identical observations in one task group),
  from discounted step returns; `mean_norm` or `mean_std_norm`. A state seen once in its task
  group has no peers to compare with: its step advantage is 0, as in the reference, which
  normalises each step group by its own mean.
- `advantages(kind, StepScores, AdvantageConfig)`: every estimator above by name (`rl.advantage`),
  from one record of a batch's step samples; the trainer calls only this.
- `policy_loss`: PPO clipped surrogate, SKILL0 eq. 5 / SkillForge eq. 5: −min(ρÂ, clip(ρ, 1−ε_low,
  1+ε_high)Â) with ρ = π/π_old, plus dual-clip (Ye et al. 2020) bounding the loss at −c·Â for Â < 0.
- `kl_penalty`: Schulman's estimators of KL(π‖π_ref) from samples of π: k1 = log π/π_ref,
  k2 = ½(log π/π_ref)², k3 = π_ref/π − 1 − log π_ref/π. As a *loss* term k1 is inert: its gradient
  is ∇log π, whose expectation under π is zero, so on on-policy samples it only adds noise. k3 is
  unbiased for the KL value, always ≥ 0, and its gradient is that of the true KL to first order;
  it is the default whenever β > 0.

Loss aggregation returns (numerator, denominator) so that summing both over micro-batches and
dividing once reproduces the full-batch loss exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# ----------------------------------------------------------------------------- advantages


def _segments(ids) -> tuple[np.ndarray, int]:
    ids = np.asarray(ids)
    _, inverse = np.unique(ids, return_inverse=True, axis=0) if ids.ndim > 1 else \
        np.unique(ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    return inverse, int(inverse.max()) + 1 if inverse.size else 0


def _group_stats(values: np.ndarray, seg: np.ndarray, n: int):
    """Per-group count, mean and unbiased std (std 1 for singleton groups)."""
    count = np.bincount(seg, minlength=n).astype(np.float64)
    total = np.bincount(seg, weights=values, minlength=n)
    mean = np.where(count > 1, total / np.maximum(count, 1), 0.0)
    sq = np.bincount(seg, weights=(values - mean[seg]) ** 2, minlength=n)
    std = np.where(count > 1, np.sqrt(sq / np.maximum(count - 1, 1)), 1.0)
    return count, total, mean, std


def _grpo(values, seg, n, eps, scores_for, seg_for):
    _, _, mean, std = _group_stats(values, seg, n)
    return (scores_for - mean[seg_for]) / (std[seg_for] + eps)


def _drgrpo(values, seg, n, eps, scores_for, seg_for):
    _, _, mean, _ = _group_stats(values, seg, n)
    return scores_for - mean[seg_for]


def _rloo(values, seg, n, eps, scores_for, seg_for):
    count, total, _, _ = _group_stats(values, seg, n)
    c = count[seg_for]
    return np.where(c > 1, scores_for - (total[seg_for] - scores_for) / np.maximum(c - 1, 1),
                    scores_for)


ADVANTAGES: dict[str, Callable] = {"grpo": _grpo, "drgrpo": _drgrpo, "rloo": _rloo}


def _device(x) -> jax.Array:
    """Host values as a float32 device array (jnp.asarray would compile a program per length)."""
    return jax.device_put(np.asarray(x, np.float32))


def group_advantages(scores, group_ids, kind: str = "grpo", eps: float = 1e-6,
                     traj_ids=None) -> jax.Array:
    """One advantage per step sample from its scalar score and its group (the G rollouts of a task).

    Without `traj_ids` (the released SKILL0 code): every step sample is one member of its group,
    in the statistics and in the numerator, so long trajectories weigh more in the baseline and,
    in a group whose trajectories all share one outcome, a step penalty alone is scaled up by the
    tiny std (8 × 50 failed steps, one penalised: A ≈ −20 for it).

    With `traj_ids` (SKILL0 eq. 5, GRPO proper): a step's score is its trajectory's score R_τ minus
    that step's own penalty (or plus its own bonus). R_τ is taken as the highest step score of the
    trajectory (penalties are subtracted per step, so it is the score of its unpenalised steps);
    the advantage is the group-normalised R_τ (kind: z-score, mean-centred, or leave-one-out over
    the group's trajectories) plus the step's own deviation s_i − R_τ, not normalised: samples
    that differ only by penalties differ by the penalties, whatever the group's spread. With
    bounded penalties |A| ≤ (G − 1)/√G + max penalty for a group of G trajectories.
    """
    if kind not in ADVANTAGES:
        raise ValueError(f"Unknown advantage kind {kind!r}; choose one of {sorted(ADVANTAGES)} "
                         "(GiGPO is gigpo_advantages).")
    scores = np.asarray(scores, np.float64).reshape(-1)
    seg, n = _segments(group_ids)
    if len(seg) != len(scores):
        raise ValueError(f"{len(scores)} scores but {len(seg)} group ids.")
    if traj_ids is None:
        return _device(ADVANTAGES[kind](scores, seg, n, eps, scores, seg))
    if len(np.asarray(traj_ids).reshape(-1)) != len(scores):
        raise ValueError(f"{len(scores)} scores but {len(np.asarray(traj_ids).reshape(-1))} "
                         "trajectory ids.")
    tseg, tn = _segments(list(zip(np.asarray(group_ids).tolist(), np.asarray(traj_ids).tolist())))
    traj_score = np.full(tn, -np.inf)
    np.maximum.at(traj_score, tseg, scores)
    traj_group = np.zeros(tn, np.int64)
    traj_group[tseg] = seg
    traj_adv = ADVANTAGES[kind](traj_score, traj_group, n, eps, traj_score, traj_group)
    return _device(traj_adv[tseg] + (scores - traj_score[tseg]))


def discounted_returns(rewards, traj_ids, step_index, gamma: float) -> np.ndarray:
    """G_t = Σ_{k ≥ t} γ^{k−t} r_k within each trajectory (steps may come in any order)."""
    rewards = np.asarray(rewards, np.float64)
    seg, n = _segments(traj_ids)
    out = np.zeros_like(rewards)
    order = np.lexsort((-np.asarray(step_index), seg))  # by trajectory, last step first
    running = np.zeros(n)
    for i in order:
        running[seg[i]] = rewards[i] + gamma * running[seg[i]]
        out[i] = running[seg[i]]
    return out


def gigpo_advantages(episode_scores, step_rewards, group_ids, traj_ids, step_index,
                     anchors: Sequence[Hashable], *, gamma: float = 1.0, mode: str = "mean_norm",
                     step_weight: float = 1.0, eps: float = 1e-6) -> jax.Array:
    """GiGPO joint advantage per step sample: A^E(τ) + ω · A^S(anchor state, step return).

    `episode_scores[i]` is the total reward of the trajectory step i belongs to (without step
    penalties: those enter once, through `step_rewards`); `step_rewards[i]` that step's reward
    (its penalty included); `anchors[i]` the step's current observation without history (equal
    anchors inside one task group form a step group; a step group of one member gets 0).
    """
    if mode not in ("mean_norm", "mean_std_norm"):
        raise ValueError(f"GiGPO mode {mode!r}; choose 'mean_norm' or 'mean_std_norm'.")
    kind = "grpo" if mode == "mean_std_norm" else "drgrpo"
    episode = np.asarray(group_advantages(episode_scores, group_ids, kind, eps, traj_ids=traj_ids))
    returns = discounted_returns(step_rewards, traj_ids, step_index, gamma)
    keys: dict = {}
    step_seg = np.array([keys.setdefault((g, a), len(keys))
                         for g, a in zip(np.asarray(group_ids).tolist(), anchors)])
    sn = len(keys)
    step = ADVANTAGES[kind](returns, step_seg, sn, eps, returns, step_seg)
    step = np.where(np.bincount(step_seg, minlength=sn)[step_seg] > 1, step, 0.0)  # no peers → 0
    return _device(episode + step_weight * step)


# ----------------------------------------------------------------------------- by name


@dataclasses.dataclass(frozen=True)
class StepScores:
    """What the estimators read, one entry per step sample (`skilljax.rewards.step_scores`).

    scores: its trajectory's reward (with any method terms) minus this step's invalid penalty.
    trajectory_scores: its trajectory's reward (with the terms), no penalty.
    step_rewards: the env's reward of this step minus this step's penalty.
    group_ids: its task group; traj_ids: its trajectory; step_index: its step in the trajectory;
    anchors: its observation without history (GiGPO's step groups).
    """
    scores: np.ndarray
    trajectory_scores: np.ndarray
    step_rewards: np.ndarray
    group_ids: Sequence[Hashable]
    traj_ids: Sequence[Hashable]
    step_index: Sequence[int]
    anchors: Sequence[Hashable]


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """`rl.group_stats`: "trajectory" (SKILL0 eq. 5: one score per trajectory, each step's penalty
    added on its own) or "step" (the released code: every step sample is a group member); see
    `group_advantages`. The gigpo_* fields are GiGPO's discount, normalisation and step weight."""
    group_stats: str = "trajectory"
    gigpo_gamma: float = 0.95
    gigpo_mode: str = "mean_norm"
    gigpo_step_weight: float = 1.0
    eps: float = 1e-6

    def __post_init__(self):
        if self.group_stats not in ("trajectory", "step"):
            raise ValueError(f"rl.group_stats={self.group_stats!r}; choose 'trajectory' or "
                             "'step'.")


def _group_estimator(kind: str) -> Callable[[StepScores, AdvantageConfig], jax.Array]:
    def estimate(x: StepScores, cfg: AdvantageConfig) -> jax.Array:
        return group_advantages(x.scores, x.group_ids, kind, cfg.eps,
                                traj_ids=x.traj_ids if cfg.group_stats == "trajectory" else None)
    return estimate


def _gigpo(x: StepScores, cfg: AdvantageConfig) -> jax.Array:
    return gigpo_advantages(x.trajectory_scores, x.step_rewards, x.group_ids, x.traj_ids,
                            x.step_index, x.anchors, gamma=cfg.gigpo_gamma, mode=cfg.gigpo_mode,
                            step_weight=cfg.gigpo_step_weight, eps=cfg.eps)


ESTIMATORS: dict[str, Callable[[StepScores, AdvantageConfig], jax.Array]] = {
    **{k: _group_estimator(k) for k in ADVANTAGES}, "gigpo": _gigpo}


def advantages(kind: str, x: StepScores, cfg: AdvantageConfig = AdvantageConfig()) -> np.ndarray:
    """One advantage per step sample by the estimator named `kind` (`rl.advantage`)."""
    if kind not in ESTIMATORS:
        raise ValueError(f"rl.advantage={kind!r}; choose one of {sorted(ESTIMATORS)}.")
    return np.asarray(ESTIMATORS[kind](x, cfg))


# ----------------------------------------------------------------------------- losses

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(values_BT, mask_BT, agg: str = "token-mean"):
    """(numerator, denominator) of the aggregated loss; loss = numerator / denominator."""
    mask = mask_BT.astype(values_BT.dtype)
    if agg == "token-mean":
        return jnp.sum(values_BT * mask), jnp.sum(mask)
    has_tokens = (jnp.sum(mask, axis=-1) > 0).astype(values_BT.dtype)
    per_seq = jnp.sum(values_BT * mask, axis=-1)
    if agg == "seq-mean-token-mean":
        per_seq = per_seq / jnp.maximum(jnp.sum(mask, axis=-1), 1)
    elif agg != "seq-mean-token-sum":
        raise ValueError(f"Unknown loss aggregation {agg!r}; choose one of {AGGREGATIONS}.")
    return jnp.sum(per_seq * has_tokens), jnp.sum(has_tokens)


def policy_loss_terms(logp, old_logp, advantages, mask, clip_low: float = 0.2,
                      clip_high: float = 0.2, dual_clip: float | None = None,
                      agg: str = "token-mean", weight=None):
    """(numerator, denominator, metric sums) of the clipped surrogate; see `policy_loss`.
    `weight` [B, T] (optional): per-token factors of the loss, e.g. truncated importance weights
    between the behaviour (sampling) policy and the old policy; they carry no gradient."""
    logp, old_logp = jnp.asarray(logp), jnp.asarray(old_logp)
    adv = jnp.asarray(advantages, logp.dtype)
    adv_BT = adv[:, None] if adv.ndim == 1 else adv
    mask = jnp.asarray(mask).astype(logp.dtype)
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    unclipped = -adv_BT * ratio
    clipped = -adv_BT * jnp.clip(ratio, 1 - clip_low, 1 + clip_high)
    loss_BT = jnp.maximum(unclipped, clipped)
    clip_hit = (clipped > unclipped).astype(logp.dtype)
    dual_hit = jnp.zeros_like(loss_BT)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (the bound is -c·A for A < 0), got {dual_clip}.")
        bound = -adv_BT * dual_clip
        dual_hit = ((adv_BT < 0) & (loss_BT > bound)).astype(logp.dtype)
        loss_BT = jnp.where(adv_BT < 0, jnp.minimum(loss_BT, bound), loss_BT)
    if weight is not None:
        loss_BT = loss_BT * jax.lax.stop_gradient(jnp.asarray(weight, loss_BT.dtype))
    num, den = aggregate(loss_BT, mask, agg)
    metrics = {"clip_frac": jnp.sum(clip_hit * mask), "dual_clip_frac": jnp.sum(dual_hit * mask),
               "approx_kl": jnp.sum(-log_ratio * mask), "tokens": jnp.sum(mask)}
    return num, den, metrics


def policy_loss(logp, old_logp, advantages, mask, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: float | None = None, agg: str = "token-mean"):
    """PPO clipped surrogate over response tokens; returns (loss, metrics incl. clip_frac).

    `logp`, `old_logp`, `mask` are [B, T]; `advantages` [B] (one per step sample, broadcast over
    its tokens) or [B, T].
    """
    num, den, sums = policy_loss_terms(logp, old_logp, advantages, mask, clip_low, clip_high,
                                       dual_clip, agg)
    tokens = jnp.maximum(sums.pop("tokens"), 1)
    return num / jnp.maximum(den, 1e-9), {k: v / tokens for k, v in sums.items()}


def kl_penalty(logp, ref_logp, kind: str = "k3") -> jax.Array:
    """Per-token estimate of KL(π ‖ π_ref) from tokens sampled from π."""
    delta = jnp.asarray(logp) - jnp.asarray(ref_logp)  # log π − log π_ref
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta ** 2
    if kind == "k3":
        return jnp.exp(-delta) - 1 + delta
    raise ValueError(f"Unknown KL estimator {kind!r}; choose k1, k2 or k3.")


def entropy_from_logits(logits_BTV) -> jax.Array:
    """Per-token entropy of softmax(logits)."""
    logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
