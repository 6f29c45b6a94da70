"""Evaluation: success per task type with and without skills, pass@k / SC@k, prompt tokens per step.

    python -m skilljax.evaluate --workdir DIR [--step STEP] [--config.a.b=v ...]

rebuilds the run's policy from DIR (its config.json, its tokenizer and its latest or given
checkpoint), plays the config's held-out test tasks with and without skills, prints the eval block
as JSON and writes it to DIR/eval_<step>.json. Overrides change the evaluation, e.g.
`--config.eval.seeds=3`; `--config configs/x.py[:arg]` replaces config.json (runs older than it). `tokens_per_step` is the mean prompt length per env step in the policy's own
tokens (the SKILL0 paper's context-cost metric). With k samples per task (temperature > 0), pass@k
counts a task solved when any sample succeeds and SC@k when a strict majority does. Also ReuseRL's
behaviour signals: mean successful-episode length, rejected ("Nothing happens.") and repeated
actions, over all episodes and over the successful ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from etils import epath

from skilljax import config as config_lib
from skilljax import console, distributed
from skilljax.envs.base import Task
from skilljax.experiment import Run, build_run
from skilljax.envs.pool import EnvPool
from skilljax.rl.rollout import (PROMPT_PARTS, RolloutConfig, behaviour_stats, merge, rollout,
                                 skill_text)
from skilljax.rl.chains import (chain_rollout, chain_stats, library_validator, merge_chains,
                                scenarios_of)
from skilljax.rl.checkpoint import Checkpointer
from skilljax.sampling import Sampler
from skilljax.tokenizer import Tokenizer


def _block(results, k: int) -> dict:
    won_by_task: dict[str, list[bool]] = {}
    types: dict[str, str] = {}
    prompt_tokens, steps = 0, 0
    for res in results:
        for t in res.trajectories:
            key = f"{t.task.id}/{t.seed}"
            won_by_task.setdefault(key, []).append(t.won)
            types[key] = t.task.type
        prompt_tokens += sum(sum(s.counts[p] for p in PROMPT_PARTS) for s in res.samples)
        steps += len(res.samples)
    per_type: dict[str, list[float]] = {}
    for key, wins in won_by_task.items():
        per_type.setdefault(types[key], []).extend(wins)
    all_wins = [w for ws in won_by_task.values() for w in ws]
    return {
        "success_rate": float(np.mean(all_wins)) if all_wins else 0.0,
        "per_task": {t: float(np.mean(v)) for t, v in sorted(per_type.items())},
        "tokens_per_step": prompt_tokens / max(steps, 1),
        f"pass@{k}": float(np.mean([any(w) for w in won_by_task.values()])),
        f"sc@{k}": float(np.mean([sum(w) * 2 > len(w) for w in won_by_task.values()])),
        "episodes": len(all_wins),
        "mean_steps": steps / max(len(all_wins), 1),
        **behaviour_stats([t for res in results for t in res.trajectories]),
    }


def evaluate_policy(sampler: Sampler, tok: Tokenizer, pool: EnvPool, tasks: Sequence[Task],
                    cfg: RolloutConfig, rng: jax.Array, *, contexts: Mapping[str, str] | None,
                    fmt, samples_per_task: int = 1, seeds: Sequence[int] = (0,),
                    modes: Sequence[str] = ("with_skills", "without_skills"),
                    catalog=None) -> dict:
    """{"with_skills": block, "without_skills": block}; blocks as the module docstring says.

    Every task is played `samples_per_task` times per seed (the rollout group), with the given
    skill contexts (task type → text) or none. When no task has skill text (skills off, as in
    ReuseRL runs), both modes are the same episodes: they are played once and both keys hold them.
    A SkillForge `catalog` (skills.evolution.Catalog) is offered with skills only.
    In a multi-process run each process plays its share of the tasks (`distributed.shard`) and the
    shares are gathered, so every process returns the blocks of all tasks.
    """
    cfg = dataclasses.replace(cfg, group_size=samples_per_task)
    same = catalog is None and not any(skill_text(contexts, t).strip() for t in tasks)
    out = {}
    progress = console.bar((1 if same else len(modes)) * len(seeds) * len(tasks), "eval",
                           unit="task")
    for mode in modes:
        if same and out:
            out[mode] = next(iter(out.values()))
            continue
        results = []
        for j, seed in enumerate(seeds):
            key = jax.random.fold_in(rng, j)
            mine = distributed.shard(len(tasks))
            local = rollout(sampler, tok, pool, tasks[mine.start:mine.stop], cfg, key,
                            seeds=[seed * 1_000_003 + i for i in mine], group_ids=mine,
                            skill_context=contexts if mode == "with_skills" else None, fmt=fmt,
                            catalog=catalog if mode == "with_skills" else None)
            results.append(merge(distributed.allgather_objects(local)))
            progress.update(len(tasks))
        out[mode] = _block(results, samples_per_task)
    progress.close()
    return out


def evaluate_chains(sampler: Sampler, tok: Tokenizer, pool: EnvPool, tasks: Sequence[Task],
                    cfg: RolloutConfig, rng: jax.Array, *, fmt, samples_per_task: int = 1,
                    seeds: Sequence[int] = (0,), validate=None,
                    modes: Sequence[str] = ("with_skills", "without_skills")) -> dict:
    """Tasks that come in scenarios (apps), played as SAGE's chains over each whole scenario:
    "with_skills" passes each chain's functions to its next task (`rl.chains`), "without_skills"
    plays the same tasks with nothing passed. Blocks as `evaluate_policy`'s (success_rate = TGC)
    plus `scenario_success_rate` (SGC), `skill_use_rate`, `library_size`, `steps_per_scenario`
    and `tokens_per_scenario` (generated), averaged over the seeds."""
    scenarios = scenarios_of(tasks)
    length = min(len(s) for s in scenarios)
    cfg = dataclasses.replace(cfg, group_size=samples_per_task)
    out = {}
    progress = console.bar(len(modes) * len(seeds) * len(scenarios), "eval", unit="scenario")
    for mode in modes:
        results, chain_blocks = [], []
        for j, seed in enumerate(seeds):
            mine = distributed.shard(len(scenarios))
            local = chain_rollout(sampler, tok, pool, scenarios[mine.start:mine.stop], cfg,
                                  jax.random.fold_in(rng, j), length=length,
                                  num_groups=len(scenarios), validate=validate,
                                  use_library=mode == "with_skills",
                                  seeds=[seed * 1_000_003 + i for i in mine],
                                  group_ids=list(mine), fmt=fmt)
            res, chains = merge_chains(distributed.allgather_objects(local), len(scenarios))
            results.append(res)
            chain_blocks.append(chain_stats(res, chains))
            progress.update(len(scenarios))
        block = _block(results, samples_per_task)
        for key in ("sgc", "skill_use_rate", "library_size", "steps_per_scenario",
                    "tokens_per_scenario"):
            block["scenario_success_rate" if key == "sgc" else key] = float(
                np.mean([b[key] for b in chain_blocks]))
        out[mode] = block
    progress.close()
    return out


def evaluate_run(run: Run, contexts: Mapping[str, str] | None, rng: jax.Array, *,
                 tasks: Sequence[Task] | None = None, seeds: Sequence[int] | None = None,
                 modes: Sequence[str] = ("with_skills", "without_skills"), catalog=None) -> dict:
    """`evaluate_policy` with a run's policy, pool and evaluation settings (`eval.*`): its test
    tasks and `eval.seeds` seeds unless `tasks` / `seeds` are given. Tasks in scenarios (apps)
    are evaluated as chains (`evaluate_chains`), whatever the run trained with."""
    c = run.config
    tasks = tasks or run.test_tasks
    if tasks and all("scenario" in t.payload for t in tasks):
        return evaluate_chains(run.sampler, run.tok, run.pool, tasks,
                               run.rollout_config(evaluation=True), rng, fmt=run.fmt,
                               samples_per_task=c.eval.samples_per_task,
                               seeds=seeds or tuple(range(c.eval.seeds)),
                               validate=library_validator(c), modes=modes)
    return evaluate_policy(run.sampler, run.tok, run.pool, tasks,
                           run.rollout_config(evaluation=True), rng, contexts=contexts,
                           fmt=run.fmt, samples_per_task=c.eval.samples_per_task,
                           seeds=seeds or tuple(range(c.eval.seeds)), modes=modes,
                           catalog=catalog)


def evaluate_workdir(workdir, config=None, step: int | None = None) -> dict:
    """The eval block of a trained workdir's checkpoint (the latest, or `step`), written to
    `WORKDIR/eval_<step>.json`. `config`: the run's config (default: `WORKDIR/config.json`)."""
    workdir = epath.Path(workdir)
    config = config if config is not None else config_lib.workdir_config(workdir)
    run = build_run(config, workdir, train_tokenizer=False)
    try:
        ckpt = Checkpointer(workdir / "checkpoints")
        step, _, host = ckpt.restore(run.model, None, step)
        ckpt.close()
        full = run.bank.contexts() if config.skills.enabled else {}
        block = evaluate_run(run, full, jax.random.key(config.seed + 1),
                             catalog=_catalog(config, host))
    finally:
        run.close()
    block["step"] = step
    if distributed.is_main():
        config_lib.write_json(workdir / f"eval_{step}.json", block)
    return block


def _catalog(config, host: dict):
    """A SkillForge run's catalog over the bank its checkpoint holds (None for other runs)."""
    if not config.evolution.enabled:
        return None
    from skilljax.experiment import catalog_config
    from skilljax.skills.evolution import Catalog, EvolvingBank
    from skilljax.skills.retrieval import make_embedder
    state = (host or {}).get("evolution")
    if not state:
        raise ValueError("This SkillForge checkpoint holds no skill bank (run state "
                         "'evolution'); was it written before RL started?")
    return Catalog(EvolvingBank.from_json(state["bank"]), make_embedder(config.evolution.embedder),
                   catalog_config(config))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=config_lib.cli_help(workdir_tool=True))
    p.add_argument("--workdir", required=True, help="a skilljax.train workdir")
    p.add_argument("--config", default=None,
                   help="configs/x.py[:arg] (default: the workdir's config.json)")
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint step to evaluate (default: the latest)")
    p.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)  # the old name
    args, overrides = p.parse_known_args(argv)
    if args.checkpoint is not None:
        p.error("--checkpoint STEP is now --step STEP (as in skilljax.tools.export_hf; "
                "--checkpoint names an HF directory there)")
    config = (config_lib.load_config(args.config, overrides) if args.config
              else config_lib.workdir_config(args.workdir, overrides))
    distributed.initialize_from_env()
    console.setup(config.metrics.progress)
    block = evaluate_workdir(args.workdir, config, args.step)
    print(json.dumps(block))


if __name__ == "__main__":
    main()
