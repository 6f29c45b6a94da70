"""What a run is built from: a config and a workdir → env pool, skill bank, task splits, tokenizer,
policy and sampler (`build_run`), and the frozen dataclasses the library modules take
(`rollout_config`, `learner_config`, `curriculum_config`, `reuse_config`).

The ConfigDict stops here: everything the builders hand on is a frozen dataclass or plain
arguments. `skilljax.train`, `skilljax.evaluate` and the tools build their runs with `build_run`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
from etils import epath

from skilljax import console, distributed, jit_cache, models
from skilljax import sharding as shd
from skilljax.envs import base as envs_base
from skilljax.envs.pool import EnvPool, open_pool
from skilljax.rl import learner as learner_lib
from skilljax.rl import losses, task_splits, warm_start
from skilljax.rl.chains import chain_rollout, library_validator, merge_chains, scenarios_of
from skilljax.rl.ahead import RolloutsAhead
from skilljax.rl.rollout import PromptConfig, RolloutConfig, ThinkAction, merge, rollout
from skilljax.sampling import Sampler, SamplingParams
from skilljax.skills import projection
from skilljax.skills.bank import SkillBank
from skilljax.skills.curriculum import CurriculumConfig
from skilljax.skills.segmentation import SegmentationConfig
from skilljax.tokenizer import Tokenizer

# ---------------------------------------------------------------------------- builders


def response_format(c):
    """`prompt.format`: "think_action" (`<think>`/`<action>`, ALFWorld-style envs),
    "search_answer" (`<search>`/`<answer>`, Search-QA) or "code" (`<code>`, the apps env)."""
    kind = c.prompt.format
    kw = {} if c.prompt.instruction is None else {"instruction": c.prompt.instruction}
    if kind == "search_answer":
        from skilljax.envs.search_qa import SearchAnswer
        return SearchAnswer(**kw)
    if kind == "code":
        from skilljax.envs.apps.env import CodeAction
        return CodeAction(**kw)
    if kind != "think_action":
        raise ValueError(f"prompt.format={kind!r}; choose 'think_action', 'search_answer' or "
                         "'code'.")
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
            top_p=c.eval.top_p if evaluation else c.rl.top_p,
            top_k=c.eval.top_k if evaluation else c.rl.top_k),
        prompt=PromptConfig(role=c.prompt.role, history_length=c.prompt.history_length,
                            show_admissible=c.prompt.show_admissible,
                            max_prompt_tokens=c.prompt.max_prompt_tokens),
        visual=visual_config(c), env_overlap=c.rl.env_overlap)


def visual_config(c):
    """`visual` (SKILL0's history image): None unless `visual.enabled`; width, font size and
    marker colours default to the env's released setting."""
    from skilljax.rl.visual import VisualConfig, parse_highlights
    v = c.visual
    if not v.enabled:
        return None
    kw = dict(padding=v.padding, min_pixels=v.min_pixels, max_pixels=v.max_pixels,
              agent_compression=v.agent_compression, expert_compression=v.expert_compression,
              skills_in_image=v.skills_in_image)
    if v.width:
        kw["width"] = v.width
    if v.font_size:
        kw["font_size"] = v.font_size
    if v.highlights:
        kw["highlights"] = parse_highlights(v.highlights)
    return VisualConfig.for_env(c.env.name, **kw)


def learner_config(c) -> learner_lib.LearnerConfig:
    r = c.rl
    return learner_lib.LearnerConfig(
        learning_rate=r.learning_rate, weight_decay=r.weight_decay, grad_clip=r.grad_clip,
        clip_low=r.clip_low, clip_high=r.clip_high, dual_clip=r.dual_clip, loss_agg=r.loss_agg,
        entropy_coef=r.entropy_coef, kl_coef=r.kl_coef, kl_kind=r.kl_kind,
        mini_batch_size=r.mini_batch_size, micro_batch_size=r.micro_batch_size,
        ppo_epochs=r.ppo_epochs, temperature=r.temperature,
        recompute_old_logp=r.recompute_old_logp, row_multiple=r.batch_multiple,
        behaviour_is_cap=r.behaviour_is_cap)


def advantage_config(c) -> losses.AdvantageConfig:
    r = c.rl
    return losses.AdvantageConfig(group_stats=r.group_stats, gigpo_gamma=r.gigpo_gamma,
                                  gigpo_mode=r.gigpo_mode, gigpo_step_weight=r.gigpo_step_weight)


def curriculum_config(c) -> CurriculumConfig:
    k = c.skills
    return CurriculumConfig(
        total_steps=c.rl.steps, validate_every=k.validate_every, num_stages=k.num_stages,
        budgets=tuple(k.budgets) if k.budgets is not None else None, filter=k.filter,
        rank=k.rank, fixed_full=k.fixed_full, keep_general=k.keep_general, strict=k.strict,
        clamp_start=k.clamp_start, validate_at_start=k.validate_at_start, seed=c.seed)


def reuse_config(c) -> SegmentationConfig | None:
    """`reuse` (ReuseRL, paper 003): None unless `reuse.enabled`. T is the episode step limit of
    training rollouts; the alphabet is the env's projection's."""
    r = c.reuse
    if not r.enabled:
        return None
    if r.mode == "none" and c.env.name not in projection.ALPHABETS:
        # Logging only (e.g. configs/default.py on an env of your own): nothing to project.
        console.info(f"reuse: env {c.env.name!r} has no skill projection; the dictionary is not "
                     "logged (reuse.mode 'none').")
        return None
    projection.projection(c.env.name)  # a clear error when the env has no projection
    return SegmentationConfig(
        mode=r.mode, coef=r.coef, horizon=rollout_config(c, evaluation=False).max_turns,
        max_phrase_len=r.max_phrase_len, buffer_size=r.buffer_size, use_buffer=r.use_buffer,
        polish=r.polish, alphabet=projection.ALPHABETS[c.env.name])


def evolution_config(c):
    from skilljax.skills.evolver import EvolutionConfig
    e = c.evolution
    return EvolutionConfig(
        every=e.every if e.evolve else 0, alpha=e.alpha, half_life=e.half_life,
        max_new_skills=e.max_new_skills, induction=e.induction, contrastive=e.contrastive,
        dedup=e.dedup, reflexion=e.reflexion, types_per_induction=e.types_per_induction,
        abstract_per_type=e.abstract_per_type, buffer_size=e.buffer_size,
        reflexion_top=e.reflexion_top, reflexion_min_conf=e.reflexion_min_conf,
        review_after_uses=e.review_after_uses, reflexion_contexts=e.reflexion_contexts,
        dedup_lexical=e.dedup_lexical, dedup_semantic=e.dedup_semantic,
        retries=e.answer_retries, domain=e.domain, domain_rules=e.domain_rules)


def catalog_config(c):
    from skilljax.skills.evolution import CatalogConfig
    e = c.evolution
    kw = {} if e.instruction is None else {"instruction": e.instruction}
    return CatalogConfig(general_k=e.general_k, specific_k=e.specific_k, **kw)


def initial_bank(c):
    """`evolution.initial_bank`: "" (empty), "env" (the env's markdown bank, one record per
    section), or a JSON file of skill records; called by id with `evolution.call_names="id"`."""
    bank = _initial_bank(c)
    if c.evolution.call_names not in ("title", "id"):
        raise ValueError(f"evolution.call_names={c.evolution.call_names!r}: 'title' or 'id'.")
    return bank.call_by_id() if c.evolution.call_names == "id" else bank


def _initial_bank(c):
    from skilljax.skills.evolution import EvolvingBank
    spec = c.evolution.initial_bank
    if not spec:
        return EvolvingBank()
    if spec == "env":
        return EvolvingBank.from_skill_bank(
            SkillBank.load(c.skills.dir) if c.skills.dir else SkillBank.for_env(c.env.name))
    path = Path(spec)
    if not path.is_file() and (Path(__file__).resolve().parent / "data" / spec).is_file():
        path = Path(__file__).resolve().parent / "data" / spec  # a packaged bank
    if not path.is_file():
        raise FileNotFoundError(f"evolution.initial_bank={spec!r}: no such file (give \"\", "
                                f"\"env\" or a JSON file of skill records).")
    return EvolvingBank.load(path)


def build_evolver(c, run: "Run"):
    """SkillForge's evolver for a run: its initial bank, embedder and teacher (answers cached in
    WORKDIR/skills/teacher_cache.jsonl)."""
    from skilljax.skills import teachers
    from skilljax.skills.evolver import Evolver
    from skilljax.skills.retrieval import make_embedder
    from skilljax.skills.rule_teacher import RuleTeacher
    t = c.evolution.teacher
    tcfg = teachers.TeacherConfig(
        kind=t.kind, base_url=t.base_url, model=t.model, api_key_env=t.api_key_env,
        timeout_s=t.timeout_s, retries=t.retries, concurrency=t.concurrency,
        checkpoint=t.checkpoint, max_new_tokens=t.max_new_tokens, temperature=t.temperature,
        replay_from=t.replay_from)
    skills_dir = epath.Path(run.workdir) / "skills"
    skills_dir.mkdir(parents=True, exist_ok=True)
    teacher = teachers.make_teacher(tcfg, cache_path=skills_dir / "teacher_cache.jsonl",
                                    rule=RuleTeacher(min_support=t.min_support),
                                    policy=(run.model, run.tok))
    embedder = make_embedder(c.evolution.embedder)
    return Evolver(initial_bank(c), teacher, embedder, evolution_config(c),
                   catalog=catalog_config(c))


def warm_start_cache(c) -> Path | None:
    """This config's entry in the warm-start cache (`sft.cache_dir`), or None."""
    return warm_start.cache_entry(c, rollout_config(c, evaluation=True).max_turns)


# ---------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Run:
    """What one process builds from the config and the workdir."""
    config: Any
    workdir: Path
    pool: EnvPool
    bank: SkillBank | None  # None: skills off and the env has no packaged bank (apps)
    tok: Tokenizer
    model: Any
    sampler: Sampler
    fmt: Any  # ThinkAction or SearchAnswer
    train_tasks: list
    val_tasks: list
    test_tasks: list

    def rollout_config(self, *, evaluation: bool) -> RolloutConfig:
        return rollout_config(self.config, evaluation=evaluation)

    def close(self) -> None:
        self.pool.close()


def model_overrides(c) -> dict:
    """The QwenConfig fields the config's `model` section sets (besides the compute dtype)."""
    overrides = {k: v for k, v in dict(c.model.overrides).items() if v is not None}
    lora = c.model.lora
    overrides.update(param_dtype=c.model.param_dtype, remat=c.model.remat,
                     scan_layers=c.model.scan_layers, lora_rank=lora.rank, lora_alpha=lora.alpha,
                     lora_targets=tuple(lora.targets))
    return overrides


def build_model(c, tok: Tokenizer, mesh=None):
    """The policy the config describes (a preset sized by the tokenizer, or an HF checkpoint)."""
    overrides = model_overrides(c)
    if not Path(c.model.checkpoint).is_dir():
        overrides.setdefault("vocab_size", tok.vocab_size)
        if c.model.checkpoint in models.qwen_vl.PRESETS:  # a random VL policy: the run's ids
            from skilljax.rl.visual import vision_ids
            start, pad, end = vision_ids(tok)
            overrides.update(image_token_id=pad, vision_start_token_id=start,
                             vision_end_token_id=end, video_token_id=pad)
    _, model = models.load(c.model.checkpoint, mesh, c.model.dtype, seed=c.seed, **overrides)
    if model.cfg.vocab_size < tok.vocab_size:
        raise ValueError(f"The model's vocabulary ({model.cfg.vocab_size}) is smaller than the "
                         f"tokenizer's ({tok.vocab_size}); they do not belong together.")
    visual = visual_config(c)
    if visual is not None:
        from skilljax.rl.visual import vision_ids
        visual.check_model(model.cfg)
        want = (model.cfg.vision_start_token_id, model.cfg.image_token_id,
                model.cfg.vision_end_token_id)
        if vision_ids(tok) != want:
            raise ValueError(f"The tokenizer's vision tokens (start, image pad, end) are "
                             f"{vision_ids(tok)}, the model's config says {want}; use the "
                             "checkpoint's own tokenizer.")
    return model


def tokenizer_corpus(pool: EnvPool, tasks, bank: SkillBank | None, fmt, cfg: RolloutConfig,
                     c=None) -> list[str]:
    """Prompts and responses of expert episodes (the texts the policy will read and write);
    with SkillForge (`c.evolution.enabled`), episodes with skill catalogs and calls too; with
    SAGE's warm start (`c.sft.chains`), expert chains that call their library's functions."""
    probe = Tokenizer.train(["a"], vocab_size=300)  # byte-level, only to render prompts
    cfg = dataclasses.replace(cfg, visual=None)  # the text prompts (an image is no text)
    if c is not None and c.sft.chains:
        scenarios = scenarios_of(tasks)
        res, _ = chain_rollout(None, probe, pool, scenarios, dataclasses.replace(
            cfg, group_size=1), jax.random.key(0), length=min(len(s) for s in scenarios),
            validate=library_validator(c), fmt=fmt, expert=True)
        return [probe.decode(s.prompt_ids + s.response_ids) for s in res.samples]
    res = rollout(None, probe, pool, tasks, dataclasses.replace(cfg, group_size=1),
                  jax.random.key(0), skill_context=lambda t: warm_start.warmup_context(bank, t),
                  fmt=fmt, expert=True)
    if c is not None and c.evolution.enabled:
        cats = warm_start.skill_catalogs(c, pool, probe, fmt, tasks)
        called = rollout(None, probe, pool, tasks, dataclasses.replace(cfg, group_size=1),
                         jax.random.key(0), fmt=fmt, expert=True, catalog=cats,
                         expert_call=cats.call_for)
        res.samples += called.samples
    return [probe.decode(s.prompt_ids + s.response_ids) for s in res.samples]


def _tokenizer(c, workdir: Path, pool, bank, fmt, train_tasks, *, train: bool) -> Tokenizer:
    """The workdir's tokenizer; else a cached warm start's, the config's (`tokenizer.path`), or,
    with `train`, one trained on expert episodes of the env (saved to the workdir)."""
    tok_dir = workdir / "tokenizer"
    distributed.barrier("tokenizer")  # every process looks before process 0 writes one
    if (tok_dir / "tokenizer.json").exists():
        return Tokenizer.load(tok_dir)
    entry = warm_start_cache(c)
    if warm_start.cached(entry):
        tok = Tokenizer.load(entry / "tokenizer")  # the warm start's own tokenizer
    elif c.tokenizer.path:
        tok = Tokenizer.load(c.tokenizer.path)
    elif train:
        cls = envs_base.env_class(c.env.name)
        corpus_tasks = (cls.make_tasks("train", c.tokenizer.corpus_tasks, seed=c.seed,
                                       **dict(c.sft.task_options))
                        + train_tasks[:c.tokenizer.corpus_tasks])
        for o in warm_start.bare_task_options(c):
            corpus_tasks += cls.make_tasks("train", c.tokenizer.corpus_tasks // 4, seed=c.seed, **o)
        corpus = tokenizer_corpus(pool, corpus_tasks, bank, fmt, rollout_config(c, evaluation=True),
                                  c)
        from skilljax.rl.visual import VISION_SPECIALS
        tok = Tokenizer.train(corpus, vocab_size=c.tokenizer.vocab_size,
                              specials=VISION_SPECIALS if c.visual.enabled else ())
    else:
        raise FileNotFoundError(f"No tokenizer in {tok_dir}: is {workdir} a training workdir?")
    if distributed.is_main():
        tok.save(tok_dir)
    return tok


def build_run(c, workdir, *, train_tokenizer: bool = True) -> Run:
    """Build everything a run needs from config `c` in `workdir` (created if missing). Without
    `train_tokenizer`, a workdir with no tokenizer (and no other source of one) is an error."""
    workdir = epath.Path(workdir)  # local or remote (gs://...)
    workdir.mkdir(parents=True, exist_ok=True)
    jit_cache.use_disk_cache(c.compilation_cache_dir)
    if c.mesh and not distributed.active():  # a launcher sets devices per process
        from skilljax.tools import request_host_devices
        request_host_devices(c.mesh)
    mesh = shd.make_mesh(c.mesh) if c.mesh else None
    # Processes the env workers depend on (a Search-QA retrieval service), run by this process.
    local = not str(workdir).startswith("gs://")
    pool = open_pool(c.env.name, dict(c.env.kwargs), num_workers=c.env.workers,
                     python=c.env.python or None, timeout_s=c.env.timeout_s,
                     sidecar_log_dir=str(workdir) if local else None)
    try:
        bank = (SkillBank.load(c.skills.dir) if c.skills.dir
                else SkillBank.for_env(c.env.name)
                if c.skills.enabled or c.env.name in SkillBank.packaged_envs() else None)
        fmt = response_format(c)
        train_tasks, val_tasks, test_tasks = task_splits.run_tasks(c)
        if c.skills.enabled:
            task_splits.check_validation_covers(bank, val_tasks, c.skills.val_split)
        tok = _tokenizer(c, workdir, pool, bank, fmt, train_tasks, train=train_tokenizer)
        model = build_model(c, tok, mesh)
    except BaseException:
        pool.close()
        raise
    sampler = Sampler(model, pad_id=tok.pad_id, max_batch=c.sampler.max_batch or None,
                      share_prefix_min=c.sampler.share_prefix_min, compact=c.sampler.compact)
    return Run(c, workdir, pool, bank, tok, model, sampler, fmt, train_tasks, val_tasks, test_tasks)


def step_rollout(run: "Run", sampler, share, rcfg, rng, scenarios, catalog, skill_context):
    """One RL step's rollout of this process's share of tasks, gathered from every process:
    (this process's part, the whole step's RolloutResult, the SAGE chains or None)."""
    c = run.config
    if scenarios is not None:
        local, chains = chain_rollout(
            sampler, run.tok, run.pool, [scenarios[i] for i in share.tasks], rcfg, rng,
            length=c.sage.chain_length, num_groups=c.rl.tasks_per_step,
            validate=library_validator(c), use_library=c.sage.library, seeds=share.seeds,
            group_ids=share.groups, fmt=run.fmt)
        res, chains = merge_chains(distributed.allgather_objects((local, chains)),
                                   c.rl.tasks_per_step)
        return local, res, chains
    local = rollout(sampler, run.tok, run.pool, [run.train_tasks[i] for i in share.tasks], rcfg,
                    rng, seeds=share.seeds, group_ids=share.groups, fmt=run.fmt, catalog=catalog,
                    skill_context=skill_context)
    return local, merge(distributed.allgather_objects(local)), None


def rollouts_ahead(c, sampler) -> RolloutsAhead | None:
    """`rl.max_staleness` > 0: rollouts started ahead of their step (`skilljax.rl.ahead`)."""
    r = c.rl
    if not r.max_staleness:
        return None
    if distributed.count() > 1:
        raise ValueError(f"rl.max_staleness={r.max_staleness} runs in one process only (a "
                         "multi-process run samples with collectives); set rl.max_staleness=0.")
    if not (r.recompute_old_logp and r.behaviour_is_cap > 0):
        raise ValueError(f"rl.max_staleness={r.max_staleness} trains on samples from older "
                         "weights: the learner must recompute the old policy and correct for the "
                         "sampler's with truncated importance weights: set rl.recompute_old_logp="
                         "true and rl.behaviour_is_cap > 0 (e.g. --config.rl.behaviour_is_cap=2).")
    return RolloutsAhead(sampler, r.max_staleness)


# ---------------------------------------------------------------------------- randomness


class Keys:
    """Named key streams of a run, all from one root key: `keys("rollout", step)`. A stream's keys
    depend only on the root, the stream's name and the index, so adding a stream or a draw never
    shifts another stream, and a resumed run draws the same keys as an uninterrupted one."""

    STREAMS = ("rollout", "update", "validation", "eval")

    def __init__(self, root: jax.Array):
        self.root = root

    def __call__(self, stream: str, index: int = 0) -> jax.Array:
        if stream not in self.STREAMS:
            raise ValueError(f"Unknown key stream {stream!r}; streams: {self.STREAMS}.")
        return jax.random.fold_in(jax.random.fold_in(self.root, self.STREAMS.index(stream) + 1),
                                  index)
