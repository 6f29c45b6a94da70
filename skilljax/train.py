"""Train an agent with GRPO and in-context skills withdrawn by the SKILL0 curriculum.

    python -m skilljax.train --config configs/default.py[:arg] --workdir DIR [--config.a.b=v ...]

Writes DIR/config.json (the resolved config, at the start), DIR/metrics.jsonl (one line per RL
step), DIR/checkpoints/, DIR/tokenizer/, DIR/summary.json and DIR/plots/*.png. Re-running with the
same DIR resumes from the last checkpoint (the warm start and the initial evaluation are not
repeated).

The trainer reads top to bottom: build (config → envs, skills, tokenizer, model; see
`skilljax.experiment`) → warm start (`skilljax.rl.warm_start`) → initial evaluation → RL loop
(rollout, rewards, advantages, update; every d steps validation with and without skills →
curriculum; checkpoints) → final evaluation → summary and plots.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import ml_collections
import numpy as np
from etils import epath

from skilljax import config as config_lib
from skilljax import console, distributed, jit_cache, rewards
from skilljax.envs import base as envs_base
from skilljax.evaluate import evaluate_run
from skilljax.experiment import (Keys, Run, advantage_config, build_evolver, build_run,
                                 curriculum_config, learner_config, reuse_config, rollouts_ahead,
                                 step_rollout, warm_start_cache)
from skilljax.metrics import MetricsWriter, NullMetrics
from skilljax.rl import batch as batch_lib
from skilljax.rl import learner as learner_lib
from skilljax.rl import losses, warm_start
from skilljax.rl.chains import scenarios_of
from skilljax.rl.checkpoint import Checkpointer, RunState
from skilljax.rl.task_stream import TaskStream
from skilljax.rl.visual import collate_kw
from skilljax.skills.curriculum import Curriculum
from skilljax.skills.evolver import Evolver, episodes_from
from skilljax.skills.segmentation import SegmentationCost


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict:
    c, workdir = config, epath.Path(workdir)  # local or remote (gs://...)
    t_start = time.time()
    console.setup(c.metrics.progress)
    console.set_step(None)
    console.info(f"skilljax.train: workdir {workdir}")
    if c.metrics.tensorboard and distributed.is_main():
        console.info(f"watch it with `tensorboard --logdir {workdir}/tensorboard` "
                     f"(or tail {workdir}/metrics.jsonl)")

    # ------------------------------------------------------------------ build
    run = build_run(c, workdir)
    learner = learner_lib.Learner(run.model, learner_config(c))
    curriculum = (Curriculum(run.bank, curriculum_config(c))
                  if c.skills.enabled and c.rl.steps > 0 else None)
    seg_cfg = reuse_config(c)
    reuse = SegmentationCost(seg_cfg) if seg_cfg is not None else None
    # SkillForge: a catalog of the evolving bank in prompts, <skill> calls, evolution every I steps.
    evolver = build_evolver(c, run) if c.evolution.enabled else None
    ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=c.checkpoint.keep)
    rng, state = jax.random.key(c.seed), RunState()
    if ckpt.steps():
        step, restored_rng, host = ckpt.restore(run.model, learner.optimizer)
        state = RunState.from_json(host)
        rng = restored_rng if restored_rng is not None else rng
        if curriculum is not None and state.curriculum:
            curriculum.load_state_dict(state.curriculum)
        if reuse is not None and state.reuse:
            reuse.load_state_dict(state.reuse)
        if evolver is not None and state.evolution:
            evolver.load_state_dict(state.evolution)
        console.info(f"resumed from step {step}")
    keys, wall_before = Keys(rng), state.wall_s

    def add_time(phase: str, seconds: float) -> None:
        state.timing[phase] = state.timing.get(phase, 0.0) + seconds

    def save(step: int) -> None:
        state.step = step
        state.curriculum = curriculum.state_dict() if curriculum is not None else None
        state.reuse = reuse.state_dict() if reuse is not None else None
        state.evolution = evolver.state_dict() if evolver is not None else None
        state.wall_s = wall_before + time.time() - t_start
        ckpt.save(step, run.model, learner.optimizer, rng=rng, host_state=state.to_json())

    add_time("build", time.time() - t_start)
    if evolver is not None:  # "auto" resolved: config.json says which embedder ranked skills
        c.evolution.embedder = evolver.embedder.name
    if distributed.is_main():  # the resolved config of this (or this resumed) run
        config_lib.write_json(workdir / "config.json", config_lib.to_dict(c))
    metrics = (MetricsWriter(workdir, config=config_lib.to_dict(c), resume_step=state.step + 1,
                             tensorboard=c.metrics.tensorboard,
                             wandb_project=c.metrics.wandb_project or None,
                             wandb_mode=c.metrics.wandb_mode or None)
               if distributed.is_main() else NullMetrics())

    # ------------------------------------------------------------------ warm start
    if state.warm_start is None and c.sft.steps > 0:
        t0 = time.time()
        entry = warm_start_cache(c)
        if (warm_start.cached(entry) and (entry / "tokenizer" / "tokenizer.json").read_bytes()
                == (workdir / "tokenizer" / "tokenizer.json").read_bytes()):
            state.warm_start = warm_start.load(entry, run)
        else:
            with (workdir / "sft_metrics.jsonl" if distributed.is_main()
                  else epath.Path(os.devnull)).open("w") as sft_log, \
                    console.bar(c.sft.steps, "warm start") as progress:

                def log(s, m):
                    progress.update(s - progress.n)
                    if s % 25 == 0 or s == c.sft.steps:
                        sft_log.write(json.dumps(m) + "\n")
                        sft_log.flush()
                        console.info(f"warm start {s}/{c.sft.steps}: loss {m['loss']:.4f}")

                state.warm_start = warm_start.run(run, log)
            if entry is not None:
                warm_start.store(entry, run, state.warm_start)
        console.info(f"warm start: {state.warm_start}")
        add_time("warm_start", time.time() - t0)
        save(0)

    # ------------------------------------------------------------------ initial evaluation
    full = run.bank.contexts() if c.skills.enabled else {}
    catalog = lambda: evolver.catalog() if evolver is not None else None
    if "initial" not in state.eval:
        t0 = time.time()
        state.eval["initial"] = evaluate_run(run, full, keys("eval", 0), catalog=catalog())
        console.info(console.eval_line("initial", state.eval["initial"]))
        add_time("eval", time.time() - t0)
        save(0)

    # ------------------------------------------------------------------ RL loop
    if curriculum is not None and state.step == 0 and curriculum.due(0) \
            and not curriculum.history:  # `skills.validate_at_start`: the released step-0 update
        m = curriculum_update(run, curriculum, 0, keys("validation", 0))
        metrics.write(0, dict(m, optimizer_steps=0, episodes=0, episodes_local=0))
        console.info("step 0:" + console.val_line(m))
        save(0)
    rcfg, adv_cfg = run.rollout_config(evaluation=False), advantage_config(c)
    success_reward = envs_base.env_class(c.env.name).success_reward
    # SAGE: the stream draws scenarios; each is played as chains of its first `chain_length` tasks.
    scenarios = scenarios_of(run.train_tasks) if c.sage.enabled else None
    stream = TaskStream(len(scenarios) if scenarios else len(run.train_tasks),
                        c.rl.tasks_per_step, c.seed)
    if state.task_stream or state.step:  # (checkpoints older than the stream: its position)
        stream.set_state(state.task_stream or {"next_index": state.step})
    ahead = rollouts_ahead(c, run.sampler)  # `rl.max_staleness`

    def rollout_of(step: int):
        """Draw step's tasks; its rollout, as a function of the sampler, with what it sees now."""
        # This process's task groups of this step; the stream's position is in every checkpoint,
        # so a resumed run reads the tasks an uninterrupted one would.
        share = next(stream)
        active = list(curriculum.active) if curriculum is not None else []
        distributed.check_same("the step and active skills", (step, active))
        ctx, cat, rng = (curriculum.contexts() if curriculum is not None else {}, catalog(),
                         keys("rollout", step))
        return lambda sampler: (active, step_rollout(run, sampler, share, rcfg, rng, scenarios,
                                                     cat, ctx))

    def sync(step: int) -> bool:  # no rollout runs ahead across these (skilljax.rl.ahead)
        return (step % c.checkpoint.every == 0 or step == c.rl.steps
                or (curriculum is not None and curriculum.due(step))
                or (evolver is not None and evolver.due(step)))

    progress = console.bar(c.rl.steps, "RL", initial=min(state.step, c.rl.steps))
    for step in range(state.step + 1, c.rl.steps + 1):
        t0 = time.time()
        console.set_step(step)
        if ahead is not None and step in ahead:  # started during an earlier step
            (active, (local, res, chains)), timing = ahead.take(step)
        else:
            active, (local, res, chains) = rollout_of(step)(run.sampler)
            timing = {} if ahead is None else {"staleness": 0.0}
        for later in ahead.plan(step, c.rl.steps, sync) if ahead is not None else ():
            ahead.submit(later, rollout_of(later), step)  # on the weights before this update
        if evolver is not None:  # evidence for the skills called (eq. 7)
            m_evo = evolver.observe(episodes_from(res.trajectories), step)
        terms, m = rewards.reuse_step(reuse, c.env.name, res) if reuse is not None else ([], {})
        if scenarios is not None and c.sage.reward:  # SAGE's skill-integrated reward
            terms.append(rewards.chain_terms(res, chains, success_reward))
        # One advantage per step sample (`rl.advantage`: grpo / drgrpo / rloo over each task's
        # group, or gigpo), from the trajectory and step scores; see `losses.advantages`.
        # SKILL0's visual path: coef·ln(cf) on successful trajectories, every n-th step.
        v = c.visual
        bonus = (rewards.compression_bonus(res, v.compression_coef, v.compression_failure_coef)
                 if v.enabled and v.agent_compression
                 and rewards.compression_due(step, v.compression_every) else None)
        adv = np.asarray(losses.advantages(c.rl.advantage, rewards.step_scores(
            res, c.rl.invalid_penalty, terms, step_bonus=bonus), adv_cfg))
        keep = [i for i in range(len(res.samples))
                if not (c.rl.drop_zero_advantage and abs(adv[i]) < 1e-8)]
        m.update(res.stats)
        if bonus is not None:
            m["compression_bonus"] = float(bonus.mean())
        if evolver is not None:
            m.update(m_evo)
        if run.pool.sidecars:  # e.g. the retrieval service: restarts so far (a died service)
            m["sidecar_restarts"] = len(run.pool.sidecar_events)
        m.update(rollout_s=time.time() - t0)
        m.update(timing, rollout_wait_s=timing.get("rollout_wait_s", m["rollout_s"]))
        m.update(trained_samples=len(keep),
                 episodes=len(res.trajectories), episodes_local=len(local.trajectories),
                 reward_mean=float(rewards.trajectory_rewards(res).mean()),
                 shaped_reward_mean=float(rewards.trajectory_rewards(res, terms).mean()),
                 active_skills=len(active), active_files=active,
                 budget=curriculum.budget(step) if curriculum is not None else 0)
        updates = []
        if keep:
            trained = [res.samples[i] for i in keep]
            batch = batch_lib.collate(trained, adv[keep], run.tok.pad_id,
                                      **collate_kw(trained, rcfg.visual, run.model.cfg))
            distributed.check_same("the learner batch", batch.tokens_BT.shape)
            updates = learner.update(batch, keys("update", step))
            for k in ("loss", "clip_frac", "approx_kl", "entropy", "grad_norm", "is_weight_mean",
                      "is_truncated_frac", "behaviour_kl"):
                if updates and k in updates[-1]:
                    m[k] = float(np.mean([u[k] for u in updates if k in u]))
        m["optimizer_steps"] = len(updates)
        m["step_s"] = time.time() - t0
        add_time("rollout", m["rollout_wait_s"])  # (what a rollout run ahead did not overlap)
        add_time("learner", m["step_s"] - m["rollout_wait_s"])

        # -------------------------------------------------------------- curriculum, evolution
        if curriculum is not None and curriculum.due(step):
            t0 = time.time()
            m.update(curriculum_update(run, curriculum, step, keys("validation", step)))
            add_time("validation", time.time() - t0)
        if evolver is not None:
            if evolver.due(step):
                t0 = time.time()
                m.update(evolve(evolver, step, workdir))
                add_time("evolution", time.time() - t0)
            m.update(evolver.metrics())
        metrics.write(step, m)
        console.info(console.step_line(step, c.rl.steps, m, len(active)))
        progress.set_postfix(success=f"{m['success_rate']:.2f}", refresh=False)
        progress.update()
        if step % c.checkpoint.every == 0 or step == c.rl.steps:
            state.task_stream = stream.get_state()
            save(step)
        if ahead is None or not ahead.busy:  # (XLA:CPU: bounded memory mappings)
            jit_cache.trim()

    progress.close()
    if ahead is not None:
        ahead.close()
    console.set_step(None)

    # ------------------------------------------------------------------ final evaluation
    if "final" not in state.eval:
        t0 = time.time()
        state.eval["final"] = evaluate_run(run, full, keys("eval", 1), catalog=catalog())
        console.info(console.eval_line("final", state.eval["final"]))
        add_time("eval", time.time() - t0)
        save(c.rl.steps)
    ckpt.close()
    metrics.close()
    run.close()
    summary = {"config": config_lib.to_dict(c), "steps": c.rl.steps,
               "wall_s": wall_before + time.time() - t_start,
               "timing_s": {k: round(v, 1) for k, v in state.timing.items()},
               "warm_start": state.warm_start, "eval": state.eval,
               "curriculum": curriculum.history if curriculum is not None else []}
    if evolver is not None:
        summary["evolution"] = dict(evolver.totals, bank_size=len(evolver.bank))
        if distributed.is_main():
            evolver.write(workdir / "skills")
    if distributed.is_main():
        config_lib.write_json(workdir / "summary.json", summary)
        from skilljax import plots
        plots.write_all(workdir)
    return summary


def evolve(evolver: Evolver, step: int, workdir) -> dict:
    """One evolution step (teacher calls on the first process only; the others take its bank),
    and the bank written to WORKDIR/skills/."""
    m = evolver.evolve(step) if distributed.is_main() else {}
    if distributed.count() > 1:
        state, m = distributed.allgather_objects(
            (evolver.state_dict(), m) if distributed.is_main() else None)[0]
        evolver.load_state_dict(state)
    if distributed.is_main():
        evolver.write(workdir / "skills")
    return m


def curriculum_update(run: Run, curriculum: Curriculum, step: int, rng) -> dict:
    """Validation passes and the curriculum update after `step`; their metrics.

    Passes share one key, so they differ only by the skill text: without skills (always), with the
    active files (skipped when the update's budget is 0, Algorithm 1), and, with
    `skills.track_full_set`, with every file (the same pass as the active one while every file is
    active), so plots can show what the full bank still adds after files are withdrawn.
    """
    c = run.config
    val = lambda ctx, modes: evaluate_run(run, ctx, rng, tasks=run.val_tasks, seeds=(0,),
                                          modes=modes)
    passes = val(curriculum.contexts(), ("with_skills", "without_skills")
                 if curriculum.needs_with_pass(step) else ("without_skills",))
    m = {"val_without_skills": passes["without_skills"]["success_rate"]}
    if "with_skills" in passes:
        m["val_with_skills"] = passes["with_skills"]["success_rate"]
    if c.skills.track_full_set:
        full = (passes["with_skills"] if set(curriculum.active) == set(run.bank.file_names)
                and "with_skills" in passes else
                val(run.bank.contexts(), ("with_skills",))["with_skills"])
        m["val_full_skills"] = full["success_rate"]
    curriculum.update(step, passes["with_skills"]["per_task"] if "with_skills" in passes else None,
                      passes["without_skills"]["per_task"])
    m.update(deltas=curriculum.history[-1]["deltas"], active_after=list(curriculum.active))
    if "val_full_skills" in m:
        curriculum.history[-1]["full_skills_success"] = m["val_full_skills"]
    return m


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=config_lib.cli_help() + """

The resolved config is written to WORKDIR/config.json, which
`python -m skilljax.evaluate --workdir WORKDIR` and
`python -m skilljax.tools.export_hf --workdir WORKDIR` read.""")
    p.add_argument("--config", required=True, help="configs/x.py[:arg]")
    p.add_argument("--workdir", required=True, help="run directory (re-run it to resume)")
    args, overrides = p.parse_known_args(argv)
    config = config_lib.load_config(args.config, overrides)
    distributed.initialize_from_env()
    train(config, args.workdir)


if __name__ == "__main__":
    main()
