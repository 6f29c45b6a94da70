"""SAGE's sequential rollouts (paper 004): chains of tasks from one scenario, each chain with its own
skill library, and the skill-integrated reward.

A chain plays the first `length` tasks of a scenario in order. After task i, the functions its code
defined (top-level `def`s of every cell, when the episode succeeded) are validated in a fresh
sandbox and join the chain's library (`skills/library.py`); task i+1 starts with that library
defined in its namespace and listed in its first observation (the env reads the task payload's
`library_code`). The library lives only as long as its chain: G chains of one scenario are G
independent libraries, and another scenario never sees them.

GRPO groups: position p of scenario k (group id `group`) is its own task, so its G episodes form
the group `p * num_groups + group`; every position is one `rollout` call, keyed by
`fold_in(rng, p)`, so the sampling of a chain does not depend on what else shares the batch.

The reward over a chain's episodes is `rewards.chain_terms` (the paper's, from
`rewards.chain_rewards`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence

import jax
import numpy as np

from skilljax.envs.base import Task
from skilljax.rl.rollout import (PREFILL_KEYS, RolloutConfig, RolloutResult, Trajectory, _stats,
                                 merge, rollout)
from skilljax.skills.library import SkillLibrary, extract_functions, sandbox_validator, used_in


def scenarios_of(tasks: Sequence[Task]) -> list[list[Task]]:
    """Tasks grouped by `payload["scenario"]`, in order of first appearance, each by position."""
    groups: dict[str, list[Task]] = {}
    for t in tasks:
        if "scenario" not in t.payload:
            raise ValueError(f"Task {t.id} has no scenario; chains need an env whose tasks come "
                             "in scenarios (apps).")
        groups.setdefault(t.payload["scenario"], []).append(t)
    return [sorted(g, key=lambda t: t.payload.get("position", 0)) for g in groups.values()]


@dataclasses.dataclass
class Chain:
    """One chain's bookkeeping: trajectory indices and library events by position."""
    scenario: str
    group: int                  # the scenario's group id (position 0's GRPO group)
    member: int
    episodes: list[int] = dataclasses.field(default_factory=list)
    offered: list[list[str]] = dataclasses.field(default_factory=list)  # library names at start
    created: list[list[str]] = dataclasses.field(default_factory=list)  # names this task added
    used: list[list[str]] = dataclasses.field(default_factory=list)     # library names it called
    used_previous: list[bool] = dataclasses.field(default_factory=list)  # called one made at i-1
    rejected: int = 0           # definitions the sandbox validation refused


def _code(traj: Trajectory) -> str:
    return "\n\n".join(a for a in traj.actions if a.strip())


class ValidationCache:
    """A library validator that remembers verdicts by (library, definition): in RL the same
    function is written many times, and each check starts a sandbox process."""

    def __init__(self, validate: Callable[[str], str]):
        self._validate, self._seen = validate, {}

    def __call__(self, source: str) -> str:
        if source not in self._seen:
            self._seen[source] = self._validate(source)
        return self._seen[source]


_VALIDATOR: ValidationCache | None = None


def library_validator(c) -> ValidationCache | None:
    """The check a function passes before it joins a chain's library (`sage.validate`): a run in
    a fresh sandbox, verdicts cached per process; None when validation is off."""
    global _VALIDATOR
    if not c.sage.validate:
        return None
    if _VALIDATOR is None:
        _VALIDATOR = ValidationCache(sandbox_validator(tempfile.mkdtemp(
            prefix="skilljax_library_")))
    return _VALIDATOR


def chain_rollout(sampler, tok, pool, scenarios: Sequence[Sequence[Task]], cfg: RolloutConfig,
                  rng: jax.Array, *, length: int, num_groups: int | None = None,
                  validate: Callable[[str], str] | None = None, use_library: bool = True,
                  seeds: Sequence[int] | None = None, group_ids: Sequence[int] | None = None,
                  fmt, expert: bool = False) -> tuple[RolloutResult, list[Chain]]:
    """Plays `cfg.group_size` chains of the first `length` tasks of each scenario.

    `num_groups`: the scenarios in the whole batch (all processes), for the group ids of later
    positions (default: the largest group id + 1). `use_library=False` plays the same chains
    without passing libraries (the "sequential rollout without skills" baseline and the
    without-skills evaluation). Returns the merged result (trajectories by position, then as
    `rollout` orders them) and the chains.
    """
    g = cfg.group_size
    n = len(scenarios)
    seeds = list(seeds) if seeds is not None else list(range(n))
    group_ids = list(group_ids) if group_ids is not None else list(range(n))
    num_groups = num_groups if num_groups is not None else max(group_ids, default=-1) + 1
    short = [s[0].payload.get("scenario") for s in scenarios if len(s) < length]
    if short:
        raise ValueError(f"Scenarios {short[:3]} have fewer than {length} tasks (chain length).")
    chains = [Chain(s[0].payload["scenario"], group_ids[k], m)
              for k, s in enumerate(scenarios) for m in range(g)]
    libraries = [SkillLibrary(validate) for _ in chains]
    results: list[RolloutResult] = []
    for p in range(length):
        key = jax.random.fold_in(rng, p)
        if p == 0:
            res = rollout(sampler, tok, pool, [s[0] for s in scenarios], cfg, key, seeds=seeds,
                          group_ids=[p * num_groups + gid for gid in group_ids], fmt=fmt,
                          expert=expert)
        else:  # one task per chain: each carries its own library
            tasks = []
            for c, lib in zip(chains, libraries):
                task = scenarios[group_ids.index(c.group)][p]
                code = lib.setup_code() if use_library else ""
                tasks.append(dataclasses.replace(task, payload=dict(task.payload,
                                                                   library_code=code))
                             if code else task)
            one = dataclasses.replace(cfg, group_size=1)
            # Sampling keys by (scenario group, member): unique per chain at this position.
            res = rollout(sampler, tok, pool, tasks, one, key,
                          seeds=[seeds[group_ids.index(c.group)] for c in chains],
                          group_ids=[(p * num_groups + c.group) * g + c.member for c in chains],
                          fmt=fmt, expert=expert)
            for t in res.trajectories:  # back to the GRPO group of (position, scenario)
                t.group //= g
            for s in res.samples:
                s.group //= g
        for c, lib, traj in zip(chains, libraries, res.trajectories):
            names_before = list(lib.functions)
            c.offered.append(names_before if use_library else [])
            code = _code(traj)
            called = sorted(used_in(code, names_before)) if use_library else []
            c.used.append(called)
            made_before = c.created[-1] if c.created else []
            c.used_previous.append(bool(set(called) & set(made_before)))
            added = []
            if traj.won and use_library:
                added = lib.add(extract_functions(code, task=p))
                c.rejected += len(lib.rejected)
                lib.rejected.clear()
            c.created.append(added)
        results.append(res)
    merged = _concat(results)
    per = len(chains)
    for k, c in enumerate(chains):
        c.episodes = [p * per + k for p in range(length)]
    merged.stats.update(chain_stats(merged, chains))
    return merged, chains


def merge_chains(parts: Sequence[tuple[RolloutResult, list[Chain]]], num_groups: int
                 ) -> tuple[RolloutResult, list[Chain]]:
    """One (result, chains) from the shares processes played of one batch of scenarios, laid out
    as one process playing them all would have (`rollout.merge`'s order: by GRPO group, which is
    position-major, then member)."""
    if len(parts) == 1:
        return parts[0]
    merged = merge([res for res, _ in parts])
    members: dict[int, int] = {}
    where: dict[tuple[int, int], int] = {}  # (GRPO group, member) -> trajectory index
    for e, t in enumerate(merged.trajectories):
        m = members.get(t.group, 0)
        members[t.group] = m + 1
        where[t.group, m] = e
    chains = sorted((dataclasses.replace(c) for _, cs in parts for c in cs),
                    key=lambda c: (c.group, c.member))
    for c in chains:
        c.episodes = [where[p * num_groups + c.group, c.member] for p in range(len(c.episodes))]
    merged.stats.update(chain_stats(merged, chains))
    return merged, chains


def _concat(results: Sequence[RolloutResult]) -> RolloutResult:
    trajs, samples = [], []
    for res in results:
        offset, base = len(trajs), len(samples)
        for t in res.trajectories:
            trajs.append(dataclasses.replace(t, samples=[base + i for i in t.samples]))
        samples += [dataclasses.replace(s, episode=s.episode + offset) for s in res.samples]
    total = lambda key: sum(r.stats.get(key, 0.0) for r in results)  # positions run in turn
    stats = _stats(samples, trajs, total("wall_s"), total("env_s"), total("sample_s"))
    stats.update({k: total(k) for k in PREFILL_KEYS if any(k in r.stats for r in results)})
    return RolloutResult(samples, trajs, stats)


def chain_stats(result: RolloutResult, chains: Sequence[Chain]) -> dict[str, float]:
    """SGC (every task of the chain solved), TGC, library size and skill use on later tasks,
    interaction steps and generated tokens per chain."""
    trajs = result.trajectories
    if not chains:
        return {}
    later = [(c, p) for c in chains for p in range(1, len(c.episodes))]
    offered = [(c, p) for c, p in later if c.offered[p]]
    tokens = lambda e: sum(len(result.samples[i].response_ids) for i in trajs[e].samples)
    return dict(
        tgc=float(np.mean([t.won for t in trajs])),
        sgc=float(np.mean([all(trajs[e].won for e in c.episodes) for c in chains])),
        library_size=float(np.mean([len(c.offered[p]) for c, p in later])) if later else 0.0,
        skill_use_rate=float(np.mean([bool(c.used[p]) for c, p in offered])) if offered
        else 0.0,
        library_rejected=float(sum(c.rejected for c in chains)),
        steps_per_scenario=float(np.mean([sum(trajs[e].steps for e in c.episodes)
                                          for c in chains])),
        tokens_per_scenario=float(np.mean([sum(tokens(e) for e in c.episodes)
                                           for c in chains])))
