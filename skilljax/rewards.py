"""Reward assembly: the score of each step sample, from plain functions of trajectories.

A step sample's score is its trajectory's reward (the env's task reward, plus any trajectory-level
terms a method adds: compression, segmentation cost, chain reward) minus the invalid-format penalty
of that step alone, as in the released SKILL0 code (`invalid_action_penalty_coef`, subtracted from
the step sample's score; `shared/reference/skill0_released_code.md` §4.4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from skilljax.rl.chains import Chain
from skilljax.rl.losses import StepScores
from skilljax.rl.rollout import RolloutResult, Trajectory
from skilljax.skills import projection
from skilljax.skills.segmentation import SegmentationCost

TrajectoryTerm = Callable[[Trajectory], float]


def task_reward(traj: Trajectory) -> float:
    """The env's reward summed over the episode (10 on success in every env here)."""
    return traj.total_reward


def segmentation_term(cost: SegmentationCost, env_name: str) -> TrajectoryTerm:
    """ReuseRL's term under `cost`'s current dictionary: −λ·seg(φ(τ), C)/T (SegCost) or −λ·|φ(τ)|/T
    (pure round length) on successful trajectories, 0 otherwise (paper 003 §4.4, app. E)."""
    def term(traj: Trajectory) -> float:
        return cost.penalty(projection.project(env_name, traj.actions, traj.task), traj.won)
    return term


def trajectory_rewards(result: RolloutResult, terms: Sequence[TrajectoryTerm] = ()) -> np.ndarray:
    """[num trajectories] task reward + every extra term."""
    return np.array([task_reward(t) + sum(f(t) for f in terms) for t in result.trajectories],
                    np.float64)


def sample_scores(result: RolloutResult, invalid_penalty: float = 0.0,
                  terms: Sequence[TrajectoryTerm] = ()) -> np.ndarray:
    """[num step samples] trajectory reward − invalid_penalty on the samples that were invalid."""
    traj = trajectory_rewards(result, terms)
    return np.array([traj[s.episode] - (0.0 if s.valid else invalid_penalty)
                     for s in result.samples], np.float64)


def compression_bonus(result: RolloutResult, coef: float, failure_coef: float = 0.0) -> np.ndarray:
    """[num step samples] SKILL0's compression reward of each step sample: coef·ln(cf) when its
    trajectory succeeded, −failure_coef·ln(cf) when it failed (cf: the factor the step chose,
    `StepSample.compression`). The released scripts use coef 0.01, failure_coef 0, and apply it
    on every n-th training step only (`compression_due`)."""
    won = [t.won for t in result.trajectories]
    return np.array([(coef if won[s.episode] else -failure_coef) * np.log(s.compression)
                     for s in result.samples], np.float64)


def compression_due(step: int, every: int) -> bool:
    """Whether RL step `step` (from 1) gets the compression reward: every `every`-th step, as the
    released reward manager counts its calls (steps 8, 16, ... for every=8)."""
    return every > 0 and step % every == 0


def step_scores(result: RolloutResult, invalid_penalty: float = 0.0,
                terms: Sequence[TrajectoryTerm] = (),
                step_bonus: np.ndarray | None = None) -> StepScores:
    """Everything an advantage estimator reads about `result`'s step samples
    (`skilljax.rl.losses.advantages`). `step_bonus` ([num step samples], e.g.
    `compression_bonus`) is added to each step sample's score as the invalid penalty is
    subtracted: to that step alone."""
    traj = trajectory_rewards(result, terms)
    samples = result.samples
    penalty = np.array([0.0 if s.valid else invalid_penalty for s in samples], np.float64)
    if step_bonus is not None:
        penalty = penalty - np.asarray(step_bonus, np.float64)
    episodes = np.array([s.episode for s in samples], np.int64)
    return StepScores(
        scores=traj[episodes] - penalty if len(samples) else np.zeros(0),
        trajectory_scores=traj[episodes] if len(samples) else np.zeros(0),
        step_rewards=np.array([s.reward for s in samples], np.float64) - penalty,
        group_ids=[s.group for s in samples], traj_ids=episodes.tolist(),
        step_index=[s.step for s in samples], anchors=[s.anchor for s in samples])


def reuse_step(reuse: SegmentationCost, env_name: str, res) -> tuple[list, dict]:
    """ReuseRL's E-step on a batch (a dictionary from its successes' skill sequences and the
    buffer), then the reward terms to score it with (none in mode "none") and `reuse_*` metrics."""
    t0 = time.perf_counter()
    m = reuse.update([projection.project(env_name, t.actions, t.task)
                      for t in res.trajectories if t.won])
    m = {f"reuse_{k}": v for k, v in m.items()}
    m["reuse_extract_s"] = time.perf_counter() - t0
    terms = [segmentation_term(reuse, env_name)] if reuse.config.mode != "none" else []
    return terms, m


def chain_rewards(r1: float, r2: float, q2_used_skill_from_q1: bool, q2_used_skill: bool,
                  has_code: tuple[bool, bool] = (True, True)) -> tuple[float, float]:
    """SAGE's skill-integrated reward of a two-task chain (paper 004; issue 30):
    R₁ = r₁ + 1[r₁=1]·1[r₂=1]·1_skill(q₂|q₁) — task 1 is credited when a function it created was
    called by task 2's successful code; R₂ = r₂ + 1[r₂=1]·1_skill(q₂) — task 2 when its successful
    code used a skill. A response with no code scores −1 whatever else holds.
    `r1`, `r2`: the tasks' outcomes, 0 or 1."""
    for name, r in (("r1", r1), ("r2", r2)):
        if r not in (0, 1):
            raise ValueError(f"chain_rewards: {name}={r!r}; task outcomes are 0 or 1.")
    big1 = -1.0 if not has_code[0] else float(
        r1 + (r1 == 1) * (r2 == 1) * bool(q2_used_skill_from_q1))
    big2 = -1.0 if not has_code[1] else float(r2 + (r2 == 1) * bool(q2_used_skill))
    return big1, big2


def chain_terms(result: RolloutResult, chains: Sequence[Chain], scale: float) -> TrajectoryTerm:
    """SAGE's skill-integrated reward over `rl.chains` chains, as a trajectory term. Position i of a
    chain scores R_i = r_i + 1[r_i=1]·1[r_{i+1}=1]·1_skill(q_{i+1}|q_i) + 1[i>1]·1[r_i=1]·1_skill(q_i)
    (−1 for an episode with no code): `chain_rewards` of the pair it opens plus what it gains
    closing the previous pair, so a chain of two gets exactly the paper's (R₁, R₂). r ∈ {0, 1} is
    the episode's success; the term added to the env reward is `scale · (R − r)`, scale = the
    env's success reward, so a success is worth what it is elsewhere."""
    bonus: dict[int, float] = {}
    trajs = result.trajectories
    for c in chains:
        r = [int(trajs[e].won) for e in c.episodes]
        code = [any(a.strip() for a in trajs[e].actions) for e in c.episodes]
        for i, e in enumerate(c.episodes):
            if not code[i]:
                big = -1.0
            else:
                big = float(r[i])
                if i + 1 < len(c.episodes):  # opening the pair (i, i+1)
                    big += chain_rewards(r[i], r[i + 1], c.used_previous[i + 1],
                                         bool(c.used[i + 1]))[0] - r[i]
                if i > 0:                    # closing the pair (i-1, i)
                    big += chain_rewards(r[i - 1], r[i], c.used_previous[i],
                                         bool(c.used[i]))[1] - r[i]
            bonus[id(trajs[e])] = scale * (big - r[i])
    return lambda traj: bonus.get(id(traj), 0.0)
