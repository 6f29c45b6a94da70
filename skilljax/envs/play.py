"""Play episodes with the expert or a random policy through the trainer's EnvPool.

    python -m skilljax.envs.play --env chores --policy expert --episodes 50 --workers 2 --split test

`--tasks k=v,...` passes options to the env's task generator (e.g. `difficulty=hard` for
textworld_cooking, `source=random` for chores), `--env-args k=v,...` to its constructor. The last
stdout line is JSON: {"success_rate", "mean_steps", "env_steps_per_s", "episodes", ...}; for envs
whose tasks come in scenarios (apps), also "scenario_success_rate" (SGC: the share of scenarios,
played whole, with every task solved; `--episodes 150` = 50 scenarios of three) and "scenarios".
A random policy picks among the admissible actions, or an env's `sample_actions` (apps).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from skilljax.config import parse_arg
from skilljax.envs import base
from skilljax.envs.pool import open_pool


def play(env: str, policy: str, episodes: int, workers: int = 2, seed: int = 0,
         split: str = "test", batch: int = 16, task_options=None, env_kwargs=None,
         timeout_s: float = 120.0, verbose: bool = False) -> dict:
    if policy not in ("expert", "random"):
        raise ValueError(f"--policy must be 'expert' or 'random', not {policy!r}.")
    cls = base.env_class(env)
    tasks = cls.make_tasks(split, episodes, seed=seed, **(task_options or {}))
    rng = random.Random(seed)
    wins, steps, failures, per_type, scenarios = 0, [], [], {}, {}
    env_steps, env_time = 0, 0.0
    with open_pool(env, env_kwargs, num_workers=workers, timeout_s=timeout_s) as pool:
        for start in range(0, len(tasks), batch):
            chunk = tasks[start:start + batch]
            resets = pool.reset(chunk, seeds=[seed * 100003 + start + i for i in range(len(chunk))])
            live = {i for i, r in enumerate(resets) if r.failure is None}
            admissible = {i: _choices(resets[i].info) for i in live}
            results = {i: None for i in range(len(chunk))}
            count = {i: 0 for i in range(len(chunk))}
            for i, r in enumerate(resets):
                if r.failure:
                    failures.append(r.failure)
            while live:
                if policy == "expert":
                    actions = pool.expert_actions(sorted(live))
                else:
                    actions = {i: rng.choice(admissible[i] or ["look"]) for i in sorted(live)}
                t0 = time.perf_counter()
                out = pool.step(actions)
                env_time += time.perf_counter() - t0
                env_steps += len(actions)
                for i, r in out.items():
                    count[i] += 1
                    admissible[i] = _choices(r.info)
                    if r.done:
                        live.discard(i)
                        results[i] = r
                        if "failure" in r.info:
                            failures.append(r.info["failure"])
            for i, task in enumerate(chunk):
                won = bool(results[i] and results[i].won)
                wins += won
                if "scenario" in task.payload:
                    scenarios.setdefault(task.payload["scenario"], []).append(won)
                steps.append(count[i])
                t = per_type.setdefault(task.type, [0, 0])
                t[0] += won
                t[1] += 1
                if verbose:
                    print(f"{task.id} ({task.type}): {'won' if won else 'lost'} in {count[i]} steps")
    stats = dict(success_rate=wins / max(len(tasks), 1),
                 mean_steps=sum(steps) / max(len(steps), 1),
                 env_steps_per_s=env_steps / env_time if env_time else 0.0, episodes=len(tasks),
                 per_type={k: v[0] / v[1] for k, v in sorted(per_type.items())},
                 failures=len(failures), restarts=pool.restarts)
    if scenarios:  # envs with scenarios (apps): SGC over the scenarios played whole
        size = max(len(v) for v in scenarios.values())
        whole = [all(v) for v in scenarios.values() if len(v) == size]
        stats.update(scenario_success_rate=sum(whole) / max(len(whole), 1),
                     scenarios=len(whole))
    return stats


def _choices(info: dict) -> list[str] | None:
    """What a random policy picks from: the admissible actions, or an env's sample actions (apps:
    random single API calls) where the game has no admissible set."""
    return info.get("admissible_actions") or info.get("sample_actions")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", required=True, help=f"one of {', '.join(base.names())} or module:Class")
    p.add_argument("--policy", default="expert", choices=("expert", "random"))
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test")
    p.add_argument("--batch", type=int, default=16, help="episodes played at once")
    p.add_argument("--tasks", default="", help="task generator options, k=v,...")
    p.add_argument("--env-args", default="", help="env constructor options, k=v,...")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    stats = play(a.env, a.policy, a.episodes, a.workers, a.seed, a.split, a.batch,
                 parse_arg(a.tasks, lazy=True).to_dict(), parse_arg(a.env_args, lazy=True).to_dict(),
                 a.timeout_s, a.verbose)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
