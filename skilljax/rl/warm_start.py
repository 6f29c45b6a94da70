"""The supervised warm start: expert step samples, SFT with held-out early stopping, and a cache.

On the CPU-scale runs the policy is trained from scratch, so before RL it learns to follow skill
text from expert episodes of randomised procedures, each shown with its own procedure text
(`shared/DESIGN.md` §6). `run(r, log)` does it on a built run (`skilljax.experiment.Run`) and returns
its record; `cache_entry` / `store` / `load` let the arms of a sweep that differ only in RL or
curriculum settings share one warm start per seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np

from skilljax import config as config_lib
from skilljax import console
from skilljax.envs import base as envs_base
from skilljax.rl import sft
from skilljax.rl.chains import chain_rollout, library_validator, scenarios_of
from skilljax.rl.checkpoint import Checkpointer
from skilljax.rl.rollout import rollout
from skilljax.skills import teacher_prompts as tp
from skilljax.skills.bank import SkillBank
from skilljax.skills.evolution import (CallResult, Catalog, EvolvingBank, SkillRecord,
                                       split_calls)
from skilljax.skills.evolver import episodes_from
from skilljax.skills.retrieval import make_embedder
from skilljax.skills.rule_teacher import RuleTeacher

if TYPE_CHECKING:
    from skilljax.experiment import Run


def warmup_context(bank: SkillBank | None, task: envs_base.Task) -> str:
    """Skill context of a warm-start task: the bank's general section and, for a randomised
    procedure, a section in the bank's shape that carries the task's own procedure text ("" for
    a run without a bank)."""
    if bank is None:
        return ""
    if task.type in bank.task_types:
        return bank.context(task.type)
    general = bank.context(bank.task_types[0], [bank.file_names[0]])
    section = task.payload["procedure"]
    return f"{general}\n\n{section}" if general else section


class TaskCatalogs:
    """SkillForge warm-start catalogs: per task description, a catalog holding the task's own
    skill and `distractors` skills of other tasks (other triggers), so the policy learns to pick
    the skill whose trigger matches its task, call it, and follow the content returned.

    Each skill is what the rule-based teacher induces from that task's expert episode alone
    (`skills.rule_teacher`, support 1): the form the teacher gives skills during RL. Duck-types
    `skills.evolution.Catalog` for `rl.rollout`; descriptions without a skill get no catalog.
    """

    def __init__(self, episodes: list[dict], embedder, cfg, distractors: int = 3,
                 naming: str = "title", id_range: int = 64):
        teacher = RuleTeacher(min_support=1)
        self.embedder, self.cfg, self.own = embedder, cfg, {}
        records: list[SkillRecord] = []
        for e in episodes:
            if e["outcome"] != "SUCCESS" or e["task"] in self.own:
                continue
            a = json.loads(teacher.complete(tp.abstraction(e)))
            item = {"task": e["task"], "task_type": e["task_type"], "abstraction": a}
            skills = json.loads(teacher.complete(tp.induction(
                e["task_type"], "extraction", [item], [], [], max_new=1, success_counts={},
                failure_counts={})))
            if skills:
                s = skills[0]
                # By id: a name from the ids RL banks use (s0001 ... s00NN), drawn per task.
                name = (f"s{1 + _hash(e['task']) % id_range:04d}" if naming == "id"
                        else s["skill_id"])
                records.append(SkillRecord(f"w{len(records)}", name, s["title"],
                                           s["principle"], s["when_to_apply"], e["task_type"],
                                           s["intent"]))
                self.own[e["task"]] = len(records) - 1
        self.records = records
        self.distractors, self._catalogs = distractors, {}

    def _catalog(self, description: str):
        if description not in self.own:
            return None
        if description not in self._catalogs:
            i = self.own[description]
            own = self.records[i]
            # Deterministic distractors with other triggers and other call names.
            rng = np.random.default_rng(_hash(description))
            picks, names = [own], {own.call_name}
            for j in rng.permutation(len(self.records)):
                r = self.records[int(j)]
                if len(picks) > self.distractors:
                    break
                if r.when_to_apply != own.when_to_apply and r.call_name not in names:
                    picks.append(r)
                    names.add(r.call_name)
            bank = EvolvingBank([dataclasses.replace(r, id=f"w{k}") for k, r in enumerate(picks)])
            self._catalogs[description] = Catalog(bank, self.embedder, self.cfg)
        return self._catalogs[description]

    def text(self, description: str, task_type: str) -> str:
        cat = self._catalog(description)
        return cat.text(description, task_type) if cat is not None else ""

    def respond(self, description: str, task_type: str, text: str):
        cat = self._catalog(description)
        if cat is None:
            clean, names, problems = split_calls(text)
            return CallResult(clean, names, problem="; ".join(problems))
        return cat.respond(description, task_type, text)

    def call_for(self, description: str) -> str | None:
        """The call name the expert appends for a task's description."""
        i = self.own.get(description)
        return self.records[i].call_name if i is not None else None


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def skill_catalogs(c, pool, tok, fmt, tasks) -> TaskCatalogs:
    """`TaskCatalogs` for warm-start tasks, from their expert episodes (`sft.catalog_distractors`
    other skills in each catalog)."""
    from skilljax.experiment import catalog_config, rollout_config
    cfg = dataclasses.replace(rollout_config(c, evaluation=True), group_size=1)
    plain = rollout(None, tok, pool, tasks, cfg, jax.random.key(0), fmt=fmt, expert=True)
    return TaskCatalogs(episodes_from(plain.trajectories), make_embedder(c.evolution.embedder),
                        catalog_config(c), distractors=c.sft.catalog_distractors,
                        naming=c.evolution.call_names)


def bare_task_options(c) -> list[dict]:
    """`sft.bare_task_options`: one generator's options or a list of them ([] when unset)."""
    options = c.sft.bare_task_options or []
    if isinstance(options, (list, tuple)):
        return [dict(o) for o in options]
    return [dict(options)]


def sft_config(c) -> sft.SFTConfig:
    return sft.SFTConfig(learning_rate=c.sft.learning_rate, warmup_steps=c.sft.warmup_steps,
                         steps=c.sft.steps, batch_size=c.sft.batch_size,
                         prompt_loss_weight=float(c.sft.prompt_loss_weight))


# ---------------------------------------------------------------------------- cache


def cache_entry(c, max_turns: int) -> Path | None:
    """Where this config's warm start is cached (`sft.cache_dir`), or None when caching is off.
    `max_turns`: the evaluation rollouts' step limit (it cuts expert episodes).

    The key hashes everything the warm start depends on (env, tokenizer, model, prompt, warm-start
    settings, skill bank, seed), so the arms of a sweep that differ only in RL or curriculum
    settings share one warm start per seed, and any change to those inputs misses the cache.
    """
    if not c.sft.cache_dir:
        return None
    if jax.process_count() > 1:
        console.info("sft.cache_dir is ignored in a multi-process run.")
        return None
    cfg = config_lib.to_dict(c)
    parts = {k: cfg.get(k) for k in ("seed", "env", "tokenizer", "model", "prompt")}
    parts["sft"] = {k: v for k, v in cfg["sft"].items() if k != "cache_dir"}
    parts["skills_dir"] = c.skills.dir
    parts["max_turns"] = max_turns
    if c.visual.enabled:  # the prompts hold images (and the compression request)
        parts["visual"] = {k: v for k, v in cfg["visual"].items() if not k.startswith("compression")}
    if c.evolution.enabled:  # the warm start shows catalogs and calls skills
        parts["evolution"] = {k: cfg["evolution"][k] for k in
                              ("general_k", "specific_k", "instruction", "embedder", "call_names")}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return Path(c.sft.cache_dir) / key


def cached(entry: Path | None) -> bool:
    return entry is not None and (entry / "warm_start.json").exists()


def store(entry: Path, r: Run, record: dict) -> None:
    """Write tokenizer, parameters and record to a temporary directory, then rename it into place
    (a crash never leaves a half-written entry; a concurrent writer's entry wins)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    r.tok.save(tmp / "tokenizer")
    ckpt = Checkpointer(tmp / "params", max_to_keep=1, async_save=False)
    ckpt.save(0, r.model, None)
    ckpt.close()
    (tmp / "warm_start.json").write_text(json.dumps(record, indent=1))
    try:
        os.replace(tmp, entry)
    except OSError:  # another run stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


def load(entry: Path, r: Run) -> dict:
    """Restore a cached warm start's parameters into `r.model`; its record."""
    ckpt = Checkpointer(entry / "params", async_save=False)
    ckpt.restore(r.model, None)
    ckpt.close()
    return dict(json.loads((entry / "warm_start.json").read_text()), cached_from=str(entry))


# ---------------------------------------------------------------------------- data and training


def data(r: Run):
    """The warm start's expert step samples: (training samples, which of them are skill-free,
    held-out samples). Held-out episodes all carry their procedure text (with `sft.with_skills`),
    so their NLL measures following skill text. With `sft.expert_noise` the training episodes
    take random actions at that rate (not training targets; a share `sft.expert_repeat` of them
    repeats the previous action) and the expert recovers from them; held-out episodes stay clean.
    """
    c = r.config
    cls = envs_base.env_class(c.env.name)
    if c.sft.chains:
        return _chain_data(r)
    # A fraction of the episodes is shown without any skill text (from `bare_task_options`, by
    # default the same generator), so the policy also learns what to do when no procedure is
    # given: for chores, procedures of verbs it knows by heart (`source="convention"`).
    # `bare_task_options` may list several generators, which share the no-skill episodes equally.
    n_bare = round(c.sft.tasks * float(c.sft.without_skills_fraction))
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
    cfg = dataclasses.replace(r.rollout_config(evaluation=True), group_size=1)
    text = (lambda t: warmup_context(r.bank, t)) if c.sft.with_skills else None
    catalogs = call = None
    if c.evolution.enabled and c.sft.with_skills:
        # SkillForge: skills come as a catalog to call from, not as text in the prompt.
        text, catalogs = None, skill_catalogs(c, r.pool, r.tok, r.fmt, tasks + held)
        call = catalogs.call_for
    played = rollout(None, r.tok, r.pool, tasks + bare, cfg, jax.random.key(0),
                     skill_context=(lambda t: "" if t.id in bare_ids else text(t)) if text
                     else None, fmt=r.fmt, expert=True,
                     expert_noise=float(c.sft.expert_noise),
                     expert_repeat=float(c.sft.expert_repeat), noise_seed=c.seed,
                     catalog=catalogs, expert_call=call)
    held_data = rollout(None, r.tok, r.pool, held, cfg, jax.random.key(0), skill_context=text,
                        fmt=r.fmt, expert=True, catalog=catalogs,
                        expert_call=catalogs.call_for if catalogs else None)
    samples = [s for s in played.samples if not s.perturbed]
    is_bare = [played.trajectories[s.episode].task.id in bare_ids for s in samples]
    return samples, is_bare, held_data.samples


def _chain_data(r: Run):
    """SAGE's warm start: expert chains over whole scenarios, each task after the first offered
    the functions the chain's earlier tasks wrote (the expert then calls them instead of writing
    them again), so the policy sees both ways of solving a task."""
    c = r.config
    if c.sft.expert_noise or c.sft.without_skills_fraction:
        raise ValueError("sft.chains plays clean expert chains: set sft.expert_noise and "
                         "sft.without_skills_fraction to 0.")
    cls = envs_base.env_class(c.env.name)
    cfg = dataclasses.replace(r.rollout_config(evaluation=True), group_size=1)
    out = []
    for split, num in (("train", c.sft.tasks), ("test", max(c.sft.tasks // 10, 9))):
        scenarios = scenarios_of(cls.make_tasks(split, num, seed=c.seed + 1,
                                                **dict(c.sft.task_options)))
        res, _ = chain_rollout(None, r.tok, r.pool, scenarios, cfg, jax.random.key(0),
                               length=min(len(s) for s in scenarios),
                               validate=library_validator(c), fmt=r.fmt, expert=True)
        out.append(res.samples)
    return out[0], [False] * len(out[0]), out[1]


def run(r: Run, log, on_check=None) -> dict:
    """The supervised warm start of `r.model`; its record (samples, steps, wall_s, final_loss,
    heldout_nll, heldout_curve, bare_admitted_at). `log(step, metrics)`: after every step.
    `on_check(step, held_samples)`: called at every held-out check (the warm-start probe's
    breakdown)."""
    c = r.config
    t0 = time.time()
    samples, is_bare, held = data(r)
    bare = [s for s, b in zip(samples, is_bare) if b]
    scfg = sft_config(c)
    # Following procedure text appears abruptly and at a seed-dependent step, so the warm start
    # checks the held-out NLL every `check_every` steps and stops once it is below the target:
    # `steps` is a budget. With `bare_after_nll`, the skill-free episodes join only once the
    # held-out NLL is below it (the policy reads skill text); before, they slow that jump down.
    visual = r.rollout_config(evaluation=True).visual  # SKILL0's history images, drawn again
    every, target = c.sft.check_every, c.sft.target_heldout_nll
    bare_after = float(c.sft.bare_after_nll)
    if bare and bare_after and (not every or bare_after < target):
        raise ValueError(f"sft.bare_after_nll={bare_after} needs sft.check_every > 0 (the held-out "
                         f"checks) and must not be below sft.target_heldout_nll={target}.")
    curve: list[tuple[int, float]] = []
    admitted: list[int] = []

    def should_stop(step: int) -> bool:
        if not every or step % every:
            return False
        curve.append((step, sft.evaluate_nll(r.model, held, r.tok.pad_id, visual=visual)))
        console.info(f"warm start {step}: held-out NLL {curve[-1][1]:.4f}")
        if on_check is not None:
            on_check(step, held)
        return curve[-1][1] < target and (admitted or not bare_after or not bare)

    def admit(step: int) -> bool:
        if curve and curve[-1][0] == step and curve[-1][1] < bare_after:
            admitted.append(step)
            console.info(f"warm start {step}: skill-free episodes join ({len(bare)} samples)")
        return bool(admitted)

    held_back = bool(bare_after and bare)  # else every sample from step 1, in rollout order
    history = sft.train(r.model, [s for s, b in zip(samples, is_bare) if not b] if held_back
                        else samples, scfg, r.tok.pad_id, seed=c.seed,
                        on_step=log,
                        should_stop=should_stop, later=bare if held_back else (),
                        admit_later=admit if held_back else None, visual=visual)
    nll = sft.evaluate_nll(r.model, held, r.tok.pad_id, visual=visual)
    if target and nll >= target:
        console.warning(f"the warm start ended at held-out NLL {nll:.3f}, above its target "
                        f"{target}: the policy may not follow skill text yet, and RL from it will "
                        "start weak. Raise sft.steps (the budget) or sft.learning_rate.")
    return dict(samples=len(samples), steps=len(history), wall_s=time.time() - t0,
                final_loss=float(np.mean([h["loss"] for h in history[-10:]])),
                heldout_nll=nll, heldout_curve=curve,
                bare_admitted_at=admitted[0] if admitted else None)
