"""Train an agent with GRPO and in-context skills withdrawn by the SKILL0 curriculum.

    python -m skilljax.train --config configs/default.py[:arg] --workdir DIR [--config.a.b=v ...]

Writes DIR/metrics.jsonl (one line per RL step), DIR/checkpoints/, DIR/tokenizer/,
DIR/summary.json and DIR/plots/*.png. Re-running with the same DIR resumes from the last
checkpoint (the warm start and the initial evaluation are not repeated).

The trainer reads top to bottom: config → mesh → envs → skills → tokenizer → model → warm start →
initial evaluation → RL loop (rollout, rewards, advantages, update; every d steps validation with
and without skills → curriculum; checkpoints) → final evaluation → summary and plots.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from skilljax import distributed, models, rewards
from skilljax import sharding as shd
from skilljax.envs import base as envs_base
from skilljax.envs.pool import EnvPool
from skilljax.evaluate import evaluate_policy
from skilljax.metrics import MetricsWriter
from skilljax.rl import learner as learner_lib
from skilljax.rl import losses, sft, task_splits
from skilljax.rl.checkpoint import Checkpointer
from skilljax.rl.rollout import (LENGTH_MULTIPLE, PromptConfig, RolloutConfig, ThinkAction, collate,
                                 rollout)
from skilljax.sampling import Sampler, SamplingParams
from skilljax.skills.bank import SkillBank
from skilljax.skills import projection
from skilljax.skills.curriculum import Curriculum, CurriculumConfig
from skilljax.skills.segmentation import SegmentationConfig, SegmentationCost
from skilljax.tokenizer import Tokenizer

# ---------------------------------------------------------------------------- config files


def load_config(spec: str, overrides: list[str] | None = None) -> ml_collections.ConfigDict:
    """`configs/x.py[:arg]` → its get_config(arg), then `--config.a.b=value` overrides."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Config file {path!r} not found.")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg or None)
    for item in overrides or []:
        if not item.startswith("--config."):
            raise ValueError(f"Unknown argument {item!r}; overrides look like --config.a.b=value.")
        key, sep, value = item[len("--config."):].partition("=")
        if not sep:
            raise ValueError(f"Override {item!r} needs a value: --config.{key}=VALUE.")
        set_path(config, key, value)
    return config


def set_path(config: ml_collections.ConfigDict, key: str, value: str) -> None:
    node = config
    for p in key.split(".")[:-1]:
        if p not in node:
            raise KeyError(f"--config.{key}: no {p!r} in the config (keys: {sorted(node.keys())}).")
        node = node[p]
    leaf = key.split(".")[-1]
    if leaf not in node:
        raise KeyError(f"--config.{key}: no {leaf!r} in the config (keys: {sorted(node.keys())}).")
    old = node[leaf]
    try:
        new = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        new = value
    if isinstance(old, bool) and isinstance(new, str):
        new = new.lower() in ("1", "true", "yes")
    elif isinstance(old, float) and isinstance(new, int):
        new = float(new)
    node[leaf] = new


def _jsonable(config: ml_collections.ConfigDict) -> dict:
    return json.loads(config.to_json_best_effort())


def write_json(path: Path, obj) -> None:
    """Write JSON through a temporary file and a rename: a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- builders
# The ConfigDict stops here: everything below takes frozen dataclasses or plain arguments.


def response_format(c):
    """`prompt.format`: "think_action" (`<think>`/`<action>`, ALFWorld-style envs) or
    "search_answer" (`<search>`/`<answer>`, Search-QA)."""
    kind = c.prompt.get("format", "think_action")
    kw = {} if c.prompt.instruction is None else {"instruction": c.prompt.instruction}
    if kind == "search_answer":
        from skilljax.envs.search_qa import SearchAnswer
        return SearchAnswer(**kw)
    if kind != "think_action":
        raise ValueError(f"prompt.format={kind!r}; choose 'think_action' or 'search_answer'.")
    return ThinkAction(require_think=c.prompt.require_think, **kw)


def rollout_config(c, *, evaluation: bool) -> RolloutConfig:
    # The env's step limit: its constructor argument when the config sets one, else its default.
    env_limit = c.env.kwargs.get("max_steps", envs_base.env_class(c.env.name).max_steps)
    return RolloutConfig(
        group_size=c.rl.group_size,
        max_turns=min(c.rl.max_turns or env_limit, env_limit),
        sampling=SamplingParams(
            max_new_tokens=c.rl.max_new_tokens,
            temperature=c.eval.temperature if evaluation else c.rl.temperature,
            top_p=c.eval.get("top_p", 1.0) if evaluation else c.rl.top_p,
            top_k=c.eval.get("top_k", 0) if evaluation else c.rl.top_k),
        prompt=PromptConfig(role=c.prompt.role, history_length=c.prompt.history_length,
                            show_admissible=c.prompt.show_admissible,
                            max_prompt_tokens=c.prompt.max_prompt_tokens))


def learner_config(c) -> learner_lib.LearnerConfig:
    r = c.rl
    return learner_lib.LearnerConfig(
        learning_rate=r.learning_rate, weight_decay=r.weight_decay, grad_clip=r.grad_clip,
        clip_low=r.clip_low, clip_high=r.clip_high, dual_clip=r.dual_clip, loss_agg=r.loss_agg,
        entropy_coef=r.entropy_coef, kl_coef=r.kl_coef, kl_kind=r.kl_kind,
        mini_batch_size=r.mini_batch_size, micro_batch_size=r.micro_batch_size,
        ppo_epochs=r.ppo_epochs, temperature=r.temperature,
        recompute_old_logp=r.recompute_old_logp, row_multiple=r.batch_multiple)


def curriculum_config(c) -> CurriculumConfig:
    k = c.skills
    return CurriculumConfig(
        total_steps=c.rl.steps, validate_every=k.validate_every, num_stages=k.num_stages,
        budgets=tuple(k.budgets) if k.budgets is not None else None, filter=k.filter,
        rank=k.rank, fixed_full=k.fixed_full, keep_general=k.keep_general, strict=k.strict,
        clamp_start=k.clamp_start, validate_at_start=k.validate_at_start, seed=c.seed)


def reuse_config(c) -> SegmentationConfig | None:
    """`reuse` (ReuseRL, paper 003): None when the config has no such section. T is the episode
    step limit of training rollouts; the alphabet is the env's projection's."""
    r = c.get("reuse")
    if r is None:
        return None
    projection.projection(c.env.name)  # a clear error when the env has no projection
    return SegmentationConfig(
        mode=r.mode, coef=r.coef, horizon=rollout_config(c, evaluation=False).max_turns,
        max_phrase_len=r.max_phrase_len, buffer_size=r.buffer_size, use_buffer=r.use_buffer,
        polish=r.polish, alphabet=projection.ALPHABETS[c.env.name])


def reuse_step(reuse: SegmentationCost, env_name: str, res) -> tuple[list, dict]:
    """ReuseRL's E-step on a batch (a dictionary from its successes' skill sequences and the
    buffer), then the reward terms to score it with (none in mode "none") and `reuse_*` metrics."""
    t0 = time.perf_counter()
    m = reuse.update([projection.project(env_name, t.actions, t.task)
                      for t in res.trajectories if t.won])
    m = {f"reuse_{k}": v for k, v in m.items()}
    m["reuse_extract_s"] = time.perf_counter() - t0
    terms = [rewards.segmentation_term(reuse, env_name)] if reuse.config.mode != "none" else []
    return terms, m


def warmup_context(bank: SkillBank, task: envs_base.Task) -> str:
    """Skill context of a warm-start task: the bank's general section and, for a randomised
    procedure, a section in the bank's shape that carries the task's own procedure text."""
    if task.type in bank.task_types:
        return bank.context(task.type)
    general = bank.context(bank.task_types[0], [bank.file_names[0]])
    section = task.payload["procedure"]
    return f"{general}\n\n{section}" if general else section


def tokenizer_corpus(pool: EnvPool, tasks, bank: SkillBank, fmt, cfg: RolloutConfig) -> list[str]:
    """Prompts and responses of expert episodes (the texts the policy will read and write)."""
    probe = Tokenizer.train(["a"], vocab_size=300)  # byte-level, only to render prompts
    res = rollout(None, probe, pool, tasks, dataclasses.replace(cfg, group_size=1),
                  jax.random.key(0), skill_context=lambda t: warmup_context(bank, t), fmt=fmt,
                  expert=True)
    return [probe.decode(s.prompt_ids + s.response_ids) for s in res.samples]


def advantages(c, res, terms) -> np.ndarray:
    """One advantage per step sample: `rl.advantage` grpo / drgrpo / rloo over each task's group,
    or gigpo (episode advantage + step advantage within identical env states of a group, from
    returns discounted by `rl.gigpo_gamma`: credit for the step that made progress).

    `rl.group_stats`: "trajectory" (SKILL0 eq. 5: one score per trajectory, normalised over the
    group; a step's invalid penalty added on its own) or "step" (the released code: every step
    sample is a group member, so in a group of equal outcomes a penalty is blown up by the tiny
    std); see `losses.group_advantages`.
    """
    groups = [s.group for s in res.samples]
    episodes = [s.episode for s in res.samples]
    scores = rewards.sample_scores(res, c.rl.invalid_penalty, terms)
    if c.rl.group_stats not in ("trajectory", "step"):
        raise ValueError(f"rl.group_stats={c.rl.group_stats!r}; choose 'trajectory' or 'step'.")
    if c.rl.advantage != "gigpo":
        return np.asarray(losses.group_advantages(
            scores, groups, c.rl.advantage,
            traj_ids=episodes if c.rl.group_stats == "trajectory" else None))
    penalty = np.array([0.0 if s.valid else c.rl.invalid_penalty for s in res.samples])
    step_rewards = np.array([s.reward for s in res.samples]) - penalty
    episode_scores = rewards.trajectory_rewards(res, terms)[episodes]  # the penalty is a step's
    return np.asarray(losses.gigpo_advantages(
        episode_scores, step_rewards, groups, episodes, [s.step for s in res.samples],
        [s.anchor for s in res.samples], gamma=c.rl.gigpo_gamma, mode=c.rl.gigpo_mode,
        step_weight=c.rl.gigpo_step_weight))


def bare_task_options(c) -> list[dict]:
    """`sft.bare_task_options`: one generator's options or a list of them ([] when unset)."""
    options = c.sft.get("bare_task_options") or []
    if isinstance(options, (list, tuple)):
        return [dict(o) for o in options]
    return [dict(options)]


def warm_start_cache(c) -> Path | None:
    """Where this config's warm start is cached (`sft.cache_dir`), or None when caching is off.

    The key hashes everything the warm start depends on (env, tokenizer, model, prompt, warm-start
    settings, skill bank, seed), so the arms of a sweep that differ only in RL or curriculum
    settings share one warm start per seed, and any change to those inputs misses the cache.
    """
    if not c.sft.get("cache_dir"):
        return None
    if jax.process_count() > 1:
        print("sft.cache_dir is ignored in a multi-process run.", flush=True)
        return None
    cfg = _jsonable(c)
    parts = {k: cfg.get(k) for k in ("seed", "env", "tokenizer", "model", "prompt")}
    parts["sft"] = {k: v for k, v in cfg["sft"].items() if k != "cache_dir"}
    parts["skills_dir"] = c.skills.dir
    parts["max_turns"] = rollout_config(c, evaluation=True).max_turns  # cuts expert episodes
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return Path(c.sft.cache_dir) / key


def _store_warm_start(entry: Path, run: "_Run", record: dict) -> None:
    """Write tokenizer, parameters and record to a temporary directory, then rename it into place
    (a crash never leaves a half-written entry; a concurrent writer's entry wins)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    run.tok.save(tmp / "tokenizer")
    ckpt = Checkpointer(tmp / "params", max_to_keep=1, async_save=False)
    ckpt.save(0, run.model, None)
    ckpt.close()
    (tmp / "warm_start.json").write_text(json.dumps(record, indent=1))
    try:
        os.replace(tmp, entry)
    except OSError:  # another run stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


def _load_warm_start(entry: Path, run: "_Run") -> dict:
    ckpt = Checkpointer(entry / "params", async_save=False)
    ckpt.restore(run.model, None)
    ckpt.close()
    return dict(json.loads((entry / "warm_start.json").read_text()), cached_from=str(entry))


# ---------------------------------------------------------------------------- training


class _NoMetrics:
    """What processes other than the first write: nothing."""

    def write(self, step, metrics) -> None:
        pass

    def close(self) -> None:
        pass


@dataclasses.dataclass
class _Run:
    """What one process builds from the config and the workdir."""
    config: Any
    workdir: Path
    pool: EnvPool
    bank: SkillBank
    tok: Tokenizer
    model: Any
    sampler: Sampler
    fmt: ThinkAction
    train_tasks: list
    val_tasks: list
    test_tasks: list


def build_model(c, tok: Tokenizer, mesh=None):
    """The policy the config describes (a preset sized by the tokenizer, or an HF checkpoint)."""
    overrides = dict(c.model.overrides)
    if not Path(c.model.checkpoint).is_dir():
        overrides.setdefault("vocab_size", tok.vocab_size)
    _, model = models.load(c.model.checkpoint, mesh, c.model.dtype, seed=c.seed, **overrides)
    if model.cfg.vocab_size < tok.vocab_size:
        raise ValueError(f"The model's vocabulary ({model.cfg.vocab_size}) is smaller than the "
                         f"tokenizer's ({tok.vocab_size}); they do not belong together.")
    return model


def _build(c, workdir: Path, *, train_tokenizer: bool) -> _Run:
    if c.get("mesh") and not distributed.active():  # a launcher sets devices per process
        from skilljax.tools import request_host_devices
        request_host_devices(c.mesh)
    mesh = shd.make_mesh(c.mesh) if c.get("mesh") else None
    pool = EnvPool(c.env.name, num_workers=c.env.workers, env_kwargs=dict(c.env.kwargs),
                   timeout_s=c.env.timeout_s)
    bank = SkillBank.load(c.skills.dir) if c.skills.dir else SkillBank.for_env(c.env.name)
    fmt = response_format(c)
    train_tasks, val_tasks, test_tasks = task_splits.run_tasks(c)
    if c.skills.enabled:
        task_splits.check_validation_covers(bank, val_tasks, c.skills.val_split)

    tok_dir = workdir / "tokenizer"
    distributed.barrier("tokenizer")  # every process looks before process 0 writes one
    cached = warm_start_cache(c)
    if (tok_dir / "tokenizer.json").exists():
        tok = Tokenizer.load(tok_dir)
    elif cached is not None and (cached / "warm_start.json").exists():
        tok = Tokenizer.load(cached / "tokenizer")  # the warm start's own tokenizer
        if distributed.is_main():
            tok.save(tok_dir)
    elif c.tokenizer.path:
        tok = Tokenizer.load(c.tokenizer.path)
        if distributed.is_main():
            tok.save(tok_dir)
    elif train_tokenizer:
        cls = envs_base.env_class(c.env.name)
        corpus_tasks = (cls.make_tasks("train", c.tokenizer.corpus_tasks, seed=c.seed,
                                       **dict(c.sft.task_options))
                        + train_tasks[:c.tokenizer.corpus_tasks])
        for o in bare_task_options(c):
            corpus_tasks += cls.make_tasks("train", c.tokenizer.corpus_tasks // 4, seed=c.seed, **o)
        corpus = tokenizer_corpus(pool, corpus_tasks, bank, fmt, rollout_config(c, evaluation=True))
        tok = Tokenizer.train(corpus, vocab_size=c.tokenizer.vocab_size)
        if distributed.is_main():
            tok.save(tok_dir)
    else:
        raise FileNotFoundError(f"No tokenizer in {tok_dir}: is {workdir} a training workdir?")

    model = build_model(c, tok, mesh)
    sampler = Sampler(model, pad_id=tok.pad_id)
    return _Run(c, workdir, pool, bank, tok, model, sampler, fmt, train_tasks, val_tasks,
                test_tasks)


def _evaluate(run: _Run, contexts, rng, tasks=None, seeds=None,
              modes=("with_skills", "without_skills")) -> dict:
    c = run.config
    return evaluate_policy(run.sampler, run.tok, run.pool, tasks or run.test_tasks,
                           rollout_config(c, evaluation=True), rng, contexts=contexts, fmt=run.fmt,
                           samples_per_task=c.eval.samples_per_task,
                           seeds=seeds or tuple(range(c.eval.seeds)), modes=modes)


def warm_start_data(run: _Run):
    """The warm start's expert step samples: (training samples, which of them are skill-free,
    held-out samples). Held-out episodes all carry their procedure text (with `sft.with_skills`),
    so their NLL measures following skill text. With `sft.expert_noise` the training episodes
    take random actions at that rate (not training targets; a share `sft.expert_repeat` of them
    repeats the previous action) and the expert recovers from them; held-out episodes stay clean.
    """
    c = run.config
    cls = envs_base.env_class(c.env.name)
    # A fraction of the episodes is shown without any skill text (from `bare_task_options`, by
    # default the same generator), so the policy also learns what to do when no procedure is
    # given: for chores, procedures of verbs it knows by heart (`source="convention"`).
    # `bare_task_options` may list several generators, which share the no-skill episodes equally.
    n_bare = round(c.sft.tasks * float(c.sft.get("without_skills_fraction", 0.0)))
    tasks = cls.make_tasks("train", c.sft.tasks - n_bare, seed=c.seed + 1,
                           **dict(c.sft.task_options))
    options = bare_task_options(c) or [dict(c.sft.task_options)]
    bare = [t for k, o in enumerate(options)
            for t in cls.make_tasks("train", n_bare // len(options) + (k < n_bare % len(options)),
                                    seed=c.seed + 2, **o)]
    bare_ids = {t.id for t in bare}
    if len(bare_ids) < len(bare) or bare_ids & {t.id for t in tasks}:
        raise ValueError("sft task ids collide between the skill and no-skill warm-start tasks.")
    held = cls.make_tasks("test", max(c.sft.tasks // 10, 8), seed=c.seed + 1,
                          **dict(c.sft.task_options))
    cfg = dataclasses.replace(rollout_config(c, evaluation=True), group_size=1)
    text = (lambda t: warmup_context(run.bank, t)) if c.sft.with_skills else None
    data = rollout(None, run.tok, run.pool, tasks + bare, cfg, jax.random.key(0),
                   skill_context=(lambda t: "" if t.id in bare_ids else text(t)) if text else None,
                   fmt=run.fmt, expert=True, expert_noise=float(c.sft.get("expert_noise", 0.0)),
                   expert_repeat=float(c.sft.get("expert_repeat", 0.0)), noise_seed=c.seed)
    held_data = rollout(None, run.tok, run.pool, held, cfg, jax.random.key(0), skill_context=text,
                        fmt=run.fmt, expert=True)
    samples = [s for s in data.samples if not s.perturbed]
    is_bare = [data.trajectories[s.episode].task.id in bare_ids for s in samples]
    return samples, is_bare, held_data.samples


def sft_config(c) -> sft.SFTConfig:
    return sft.SFTConfig(learning_rate=c.sft.learning_rate, warmup_steps=c.sft.warmup_steps,
                         steps=c.sft.steps, batch_size=c.sft.batch_size,
                         prompt_loss_weight=float(c.sft.get("prompt_loss_weight", 0.0)))


def _warm_start(run: _Run, log, on_check=None) -> dict:
    """The supervised warm start. `on_check(step, held_samples)`: called at every held-out check
    (the warm-start probe's breakdown)."""
    c = run.config
    t0 = time.time()
    samples, is_bare, held = warm_start_data(run)
    bare = [s for s, b in zip(samples, is_bare) if b]
    scfg = sft_config(c)
    # Following procedure text appears abruptly and at a seed-dependent step, so the warm start
    # checks the held-out NLL every `check_every` steps and stops once it is below the target:
    # `steps` is a budget. With `bare_after_nll`, the skill-free episodes join only once the
    # held-out NLL is below it (the policy reads skill text); before, they slow that jump down.
    every, target = c.sft.get("check_every", 0), c.sft.get("target_heldout_nll", 0.0)
    bare_after = float(c.sft.get("bare_after_nll", 0.0))
    if bare and bare_after and (not every or bare_after < target):
        raise ValueError(f"sft.bare_after_nll={bare_after} needs sft.check_every > 0 (the held-out "
                         f"checks) and must not be below sft.target_heldout_nll={target}.")
    curve: list[tuple[int, float]] = []
    admitted: list[int] = []

    def should_stop(step: int) -> bool:
        if not every or step % every:
            return False
        curve.append((step, sft.evaluate_nll(run.model, held, run.tok.pad_id)))
        print(f"warm start {step}: held-out NLL {curve[-1][1]:.4f}", flush=True)
        if on_check is not None:
            on_check(step, held)
        return curve[-1][1] < target and (admitted or not bare_after or not bare)

    def admit(step: int) -> bool:
        if curve and curve[-1][0] == step and curve[-1][1] < bare_after:
            admitted.append(step)
            print(f"warm start {step}: skill-free episodes join ({len(bare)} samples)", flush=True)
        return bool(admitted)

    held_back = bool(bare_after and bare)  # else every sample from step 1, in rollout order
    history = sft.train(run.model, [s for s, b in zip(samples, is_bare) if not b] if held_back
                        else samples, scfg, run.tok.pad_id, seed=c.seed,
                        on_step=lambda s, m: log(s, m) if s % 25 == 0 or s == scfg.steps else None,
                        should_stop=should_stop, later=bare if held_back else (),
                        admit_later=admit if held_back else None)
    nll = sft.evaluate_nll(run.model, held, run.tok.pad_id)
    if target and nll >= target:
        print(f"WARNING: the warm start ended at held-out NLL {nll:.3f}, above its target "
              f"{target}: the policy may not follow skill text yet, and RL from it will start "
              f"weak. Raise sft.steps (the budget) or sft.learning_rate.",
              flush=True)
    return dict(samples=len(samples), steps=len(history), wall_s=time.time() - t0,
                final_loss=float(np.mean([h["loss"] for h in history[-10:]])),
                heldout_nll=nll, heldout_curve=curve,
                bare_admitted_at=admitted[0] if admitted else None)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict:
    c, workdir = config, Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    print(f"skilljax.train: workdir {workdir}", flush=True)

    # ------------------------------------------------------------------ build
    run = _build(c, workdir, train_tokenizer=True)
    lcfg = learner_config(c)
    learner = learner_lib.Learner(run.model, lcfg)
    curriculum = (Curriculum(run.bank, curriculum_config(c))
                  if c.skills.enabled and c.rl.steps > 0 else None)
    seg_cfg = reuse_config(c)
    reuse = SegmentationCost(seg_cfg) if seg_cfg is not None else None
    ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=c.checkpoint.keep)
    rng = jax.random.key(c.seed)
    host: dict[str, Any] = {"step": 0, "eval": {}, "warm_start": None, "wall_s": 0.0}
    timing: dict[str, float] = {}  # seconds per phase of this run (resumed runs add theirs)

    def add_time(phase: str, seconds: float) -> None:
        timing[phase] = timing.get(phase, 0.0) + seconds
    if ckpt.steps():
        step, _, host = ckpt.restore(run.model, learner.optimizer)
        if curriculum is not None and host.get("curriculum"):
            curriculum.load_state_dict(host["curriculum"])
        if reuse is not None and host.get("reuse"):
            reuse.load_state_dict(host["reuse"])
        print(f"resumed from step {step}", flush=True)
    timing.update(host.get("timing", {}))
    add_time("build", time.time() - t_start)
    if distributed.is_main():  # the resolved config of this (or this resumed) run
        write_json(workdir / "config.json", _jsonable(c))
    metrics = (MetricsWriter(workdir, config=_jsonable(c), resume_step=host["step"] + 1,
                             tensorboard=c.metrics.tensorboard)
               if distributed.is_main() else _NoMetrics())

    def contexts():
        if curriculum is None:
            return {}
        return curriculum.contexts()

    def save(step):
        if curriculum is not None:
            host["curriculum"] = curriculum.state_dict()
        if reuse is not None:
            host["reuse"] = reuse.state_dict()
        host["step"] = step
        host["wall_s"] = host.get("wall_s_base", 0.0) + time.time() - t_start
        host["timing"] = dict(timing)
        ckpt.save(step, run.model, learner.optimizer, rng=rng, host_state=host)

    host["wall_s_base"] = host.get("wall_s", 0.0)

    # ------------------------------------------------------------------ warm start
    if host["warm_start"] is None and c.sft.steps > 0:
        t0 = time.time()
        entry = warm_start_cache(c)
        if (entry is not None and (entry / "warm_start.json").exists()
                and (entry / "tokenizer" / "tokenizer.json").read_bytes()
                == (workdir / "tokenizer" / "tokenizer.json").read_bytes()):
            host["warm_start"] = _load_warm_start(entry, run)
        else:
            sft_log = open(workdir / "sft_metrics.jsonl" if distributed.is_main() else os.devnull,
                           "w")
            host["warm_start"] = _warm_start(run, lambda s, m: (
                sft_log.write(json.dumps(m) + "\n"), sft_log.flush(),
                print(f"warm start {s}/{c.sft.steps}: loss {m['loss']:.4f}", flush=True)))
            sft_log.close()
            if entry is not None:
                _store_warm_start(entry, run, host["warm_start"])
        print(f"warm start: {host['warm_start']}", flush=True)
        add_time("warm_start", time.time() - t0)
        save(0)

    # ------------------------------------------------------------------ initial evaluation
    full = run.bank.contexts() if c.skills.enabled else {}
    if "initial" not in host["eval"]:
        t0 = time.time()
        host["eval"]["initial"] = _evaluate(run, full, jax.random.fold_in(rng, 10**6))
        _print_eval("initial", host["eval"]["initial"])
        add_time("eval", time.time() - t0)
        save(0)

    # ------------------------------------------------------------------ RL loop
    if curriculum is not None and host["step"] == 0 and curriculum.due(0) \
            and not curriculum.history:  # `skills.validate_at_start`: the released step-0 update
        m = curriculum_update(run, curriculum, 0, jax.random.fold_in(rng, 10**6))
        metrics.write(0, dict(m, optimizer_steps=0, episodes=0, episodes_local=0))
        print("step 0:" + _val_line(m), flush=True)
        save(0)
    rcfg = rollout_config(c, evaluation=False)
    for step in range(host["step"] + 1, c.rl.steps + 1):
        t0 = time.time()
        # Tasks of this step: a deterministic function of (seed, step), so a resumed run sees
        # the same data as an uninterrupted one.
        task_rng = np.random.default_rng([c.seed, step])
        idx = task_rng.choice(len(run.train_tasks), c.rl.tasks_per_step, replace=False)
        tasks = [run.train_tasks[i] for i in idx]
        key = jax.random.fold_in(rng, step)
        active = list(curriculum.active) if curriculum is not None else []
        res = rollout(run.sampler, run.tok, run.pool, tasks, rcfg, key,
                      seeds=[int(x) for x in task_rng.integers(0, 2**31, len(tasks))],
                      skill_context=contexts(), fmt=run.fmt)
        terms, m = reuse_step(reuse, c.env.name, res) if reuse is not None else ([], {})
        adv = advantages(c, res, terms)
        keep = [i for i in range(len(res.samples))
                if not (c.rl.drop_zero_advantage and abs(adv[i]) < 1e-8)]
        m.update(res.stats)
        # Every process plays every episode until rollouts are split across hosts.
        m.update(rollout_s=time.time() - t0, trained_samples=len(keep),
                 episodes=len(res.trajectories), episodes_local=len(res.trajectories),
                 reward_mean=float(rewards.trajectory_rewards(res).mean()),
                 shaped_reward_mean=float(rewards.trajectory_rewards(res, terms).mean()),
                 active_skills=len(active), active_files=active,
                 budget=curriculum.budget(step) if curriculum is not None else 0)
        updates = []
        if keep:
            batch = learner_lib.Batch(**collate([res.samples[i] for i in keep], adv[keep],
                                                run.tok.pad_id, multiple=LENGTH_MULTIPLE))
            updates = learner.update(batch, jax.random.fold_in(key, 1))
            for k in ("loss", "clip_frac", "approx_kl", "entropy", "grad_norm"):
                if updates and k in updates[-1]:
                    m[k] = float(np.mean([u[k] for u in updates if k in u]))
        m["optimizer_steps"] = len(updates)
        m["step_s"] = time.time() - t0
        add_time("rollout", m["rollout_s"])
        add_time("learner", m["step_s"] - m["rollout_s"])

        # -------------------------------------------------------------- curriculum
        if curriculum is not None and curriculum.due(step):
            t0 = time.time()
            m.update(curriculum_update(run, curriculum, step,
                                       jax.random.fold_in(rng, 10**6 + step)))
            add_time("validation", time.time() - t0)
        metrics.write(step, m)
        print(f"step {step}/{c.rl.steps}: success {m['success_rate']:.3f} "
              f"invalid {m['invalid_rate']:.3f} skills {len(active)} "
              f"({m['step_s']:.1f}s)" + _val_line(m), flush=True)
        if step % c.checkpoint.every == 0 or step == c.rl.steps:
            save(step)

    # ------------------------------------------------------------------ final evaluation
    if "final" not in host["eval"]:
        t0 = time.time()
        host["eval"]["final"] = _evaluate(run, full, jax.random.fold_in(rng, 2 * 10**6))
        _print_eval("final", host["eval"]["final"])
        add_time("eval", time.time() - t0)
        save(c.rl.steps)
    ckpt.close()
    metrics.close()
    run.pool.close()
    summary = {"config": _jsonable(c), "steps": c.rl.steps,
               "wall_s": host.get("wall_s_base", 0.0) + time.time() - t_start,
               "timing_s": {k: round(v, 1) for k, v in timing.items()},
               "warm_start": host["warm_start"], "eval": host["eval"],
               "curriculum": curriculum.history if curriculum is not None else []}
    if distributed.is_main():
        write_json(workdir / "summary.json", summary)
        from skilljax import plots
        plots.write_all(workdir)
    return summary


def curriculum_update(run: _Run, curriculum: Curriculum, step: int, rng) -> dict:
    """Validation passes and the curriculum update after `step`; their metrics.

    Passes share one key, so they differ only by the skill text: without skills (always), with the
    active files (skipped when the update's budget is 0, Algorithm 1), and, with
    `skills.track_full_set`, with every file (the same pass as the active one while every file is
    active), so plots can show what the full bank still adds after files are withdrawn.
    """
    c = run.config
    val = lambda ctx, modes: _evaluate(run, ctx, rng, tasks=run.val_tasks, seeds=(0,), modes=modes)
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


def _val_line(m: dict) -> str:
    if "val_without_skills" not in m:
        return ""
    parts = [f" val without {m['val_without_skills']:.2f}"]
    if "val_with_skills" in m:
        parts.append(f"active {m['val_with_skills']:.2f}")
    if "val_full_skills" in m:
        parts.append(f"all files {m['val_full_skills']:.2f}")
    return " ".join(parts)


def _print_eval(phase: str, block: dict) -> None:
    w, wo = block["with_skills"], block["without_skills"]
    print(f"eval {phase}: with skills {w['success_rate']:.3f} ({w['tokens_per_step']:.0f} tok/step)"
          f", without {wo['success_rate']:.3f} ({wo['tokens_per_step']:.0f} tok/step)", flush=True)


def evaluate_workdir(config, workdir, step: int | None = None) -> dict:
    """The eval block of a trained workdir's checkpoint (the latest, or `step`)."""
    workdir = Path(workdir)
    run = _build(config, workdir, train_tokenizer=False)
    ckpt = Checkpointer(workdir / "checkpoints")
    step, _, _ = ckpt.restore(run.model, None, step)
    ckpt.close()
    full = run.bank.contexts() if config.skills.enabled else {}
    block = _evaluate(run, full, jax.random.key(config.seed + 1))
    run.pool.close()
    block["step"] = step
    if distributed.is_main():
        write_json(workdir / f"eval_{step}.json", block)
    return block


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="configs/x.py[:arg]")
    p.add_argument("--workdir", required=True)
    args, overrides = p.parse_known_args(argv)
    config = load_config(args.config, overrides)
    distributed.initialize_from_env()
    train(config, args.workdir)


if __name__ == "__main__":
    main()
