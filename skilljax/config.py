"""Helpers shared by the config files in configs/ (big_vision style)."""

from __future__ import annotations

import ast

import ml_collections


def parse_arg(arg: str | None, *, lazy: bool = False, **spec) -> ml_collections.ConfigDict:
    """Parse `--config configs/x.py:model=tiny,runlocal` against `spec` (name → default).

    A bare `name` sets a boolean to True; `name=value` is converted to the default's type. Unknown
    names raise unless `lazy`, in which case they are kept as strings or literals.
    """
    out = ml_collections.ConfigDict(dict(spec))
    for part in filter(None, (p.strip() for p in (arg or "").split(","))):
        name, sep, value = part.partition("=")
        if name not in spec and not lazy:
            raise ValueError(f"Unknown config argument {name!r} in {arg!r}; known: {sorted(spec)}.")
        default = spec.get(name)
        if not sep:
            if default is not None and not isinstance(default, bool):
                raise ValueError(f"Config argument {name!r} needs a value ({name}=...).")
            out[name] = True
        elif isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"Config argument {name}={value!r}: expected true/false.")
            out[name] = value.lower() in ("true", "1")
        elif default is None or isinstance(default, str):
            out[name] = value if default is not None else _literal(value)
        else:
            out[name] = type(default)(value)
    return out


def _literal(value: str):
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def skill0_variants(num_files: int) -> dict[str, dict[str, object]]:
    """The SKILL0 paper's Table 2 / Figure 7 ablations for a bank of `num_files` skill files:
    name → {"section.key": value} overrides of a config's `skills` section."""
    n, half = num_files, max(num_files // 2, 1)
    return {
        "curriculum": {},
        "fixed_full": {"skills.fixed_full": True},           # every file, never withdrawn
        "budget_full": {"skills.budgets": (n, n, n)},        # [N, N, N]: filter and rank, no decay
        "budget_half": {"skills.budgets": (half,) * 3},      # [N/2, N/2, N/2]
        "no_skills": {"skills.budgets": (0, 0, 0)},          # [0, 0, 0]: GRPO without skills
        "no_filter": {"skills.filter": False},
        "no_rank": {"skills.rank": "random"},
    }


def apply_variant(config: ml_collections.ConfigDict, variants: dict, name: str) -> None:
    if name not in variants:
        raise ValueError(f"Unknown variant {name!r}; choose one of {sorted(variants)}.")
    for key, value in variants[name].items():
        section, leaf = key.split(".")
        config[section][leaf] = value


def reuse_section(mode: str = "none") -> dict:
    """A config's `reuse` section (ReuseRL, paper 003): the segmentation-cost reward term.

    mode "none" still extracts and logs the dictionary (so vanilla GRPO runs report the same
    signals); "length" is the pure round-length baseline −λ·|s|/T, "segcost" −λ·seg(s, C)/T.
    λ = 10 with success reward 10 and a 256-sequence FIFO success buffer (app. E); the maximum
    phrase length L is not stated in the paper: 4 here. `polish` adds the local search after greedy
    BPE to every extraction (both buffer arms alike).
    """
    return dict(mode=mode, coef=10.0, max_phrase_len=4, buffer_size=256, use_buffer=True,
                polish=False)


# The paper's four arms (§4.4, §6.2): name → overrides of the `reuse` section.
REUSE_VARIANTS: dict[str, dict[str, object]] = {
    "grpo": {"reuse.mode": "none"},
    "length": {"reuse.mode": "length"},
    "segcost": {"reuse.mode": "segcost"},
    "segcost_no_buffer": {"reuse.mode": "segcost", "reuse.use_buffer": False},
}


def reuserl_base(arg, *, env: dict, model: str, horizon: int, eval_sampling: dict,
                 cpu: dict) -> ml_collections.ConfigDict:
    """The ReuseRL configs' shared body (configs/reuserl_*.py; paper 003 §4.3, app. E).

    Paper settings: GRPO for 300 steps, terminal reward 10, λ = 10, invalid-action penalty 0.01,
    a 256-sequence success buffer, step limit `horizon` (T). Not stated in the paper, so taken from
    the verl-agent ALFWorld recipe it builds on (as SKILL0's released scripts use it): lr 1e-6,
    AdamW weight decay 0.01, G = 8 rollouts per task, 16 tasks per step, one optimiser step per
    256 step samples, token-mean loss, no KL, entropy 0.001.
    `arg.cpu`: the CPU-scale run instead — a tiny policy trained from scratch with a tokenizer on
    the env's text and a supervised warm start on expert episodes, then the same arms; `cpu` holds
    that env's task options and sizes (`horizon`: a shorter step limit T for the easier CPU-scale
    tasks; `micro_batch_size`: accumulate gradients over micro-batches
    of that many step samples, for envs whose long prompts would not fit one batch in memory).
    `arg.runlocal`: a two-minute smoke run.
    """
    if not (arg.checkpoint or arg.cpu or arg.runlocal):
        raise ValueError(f"A ReuseRL config needs checkpoint=<HF directory of {model}> (weights "
                         "are never downloaded), or cpu (the CPU-scale run), or runlocal.")
    c = ml_collections.ConfigDict()
    c.seed = arg.seed
    c.mesh = ""
    c.env = dict(name=env["name"], workers=16, timeout_s=300.0, kwargs={"max_steps": horizon},
                 task_options=dict(env.get("task_options", {})), train_tasks=5000,
                 test_split=env.get("test_split", "test"))
    c.tokenizer = dict(path=arg.checkpoint, vocab_size=0, corpus_tasks=0)
    c.model = dict(checkpoint=arg.checkpoint, dtype="bfloat16", overrides={})
    c.prompt = dict(role=env["role"], history_length=env.get("history_length", 2),
                    show_admissible=env.get("show_admissible", True), require_think=True,
                    instruction=None, max_prompt_tokens=4096, format="think_action")
    c.sft = dict(steps=0, batch_size=16, learning_rate=1e-5, warmup_steps=0, tasks=0,
                 check_every=0, target_heldout_nll=0.0, with_skills=False, task_options={},
                 without_skills_fraction=0.0, bare_task_options={}, expert_noise=0.0,
                 expert_repeat=0.0, cache_dir="")
    c.rl = dict(steps=300, tasks_per_step=16, group_size=8, max_turns=horizon,
                max_new_tokens=512, temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-6,
                weight_decay=0.01, grad_clip=1.0, clip_low=0.2, clip_high=0.28, dual_clip=3.0,
                loss_agg="token-mean", entropy_coef=0.001, kl_coef=0.0, kl_kind="k3",
                mini_batch_size=256, micro_batch_size=8, ppo_epochs=1, recompute_old_logp=True,
                advantage="grpo", group_stats="trajectory", gigpo_gamma=0.95,
                gigpo_mode="mean_norm", gigpo_step_weight=1.0, invalid_penalty=0.01,
                drop_zero_advantage=False, batch_multiple=64)
    # No in-context skills: ReuseRL's skills are the dictionary's phrases, not texts.
    c.skills = dict(enabled=False, dir="", validate_every=10, num_stages=3, budgets=None,
                    filter=True, rank="delta", fixed_full=False, keep_general=True, strict=False,
                    val_tasks_per_type=4, val_split="train", clamp_start=True,
                    validate_at_start=False, track_full_set=True)
    c.eval = dict(tasks=env.get("eval_tasks", 256), samples_per_task=1, seeds=3, **eval_sampling)
    c.reuse = reuse_section()
    c.checkpoint = dict(every=20, keep=2)
    c.metrics = dict(tensorboard=True)
    c = ml_collections.ConfigDict(c)
    apply_variant(c, REUSE_VARIANTS, arg.variant)

    if arg.cpu or arg.runlocal:
        c.env.update(workers=2, train_tasks=cpu["train_tasks"], task_options=cpu["task_options"])
        c.env.kwargs.max_steps = c.rl.max_turns = cpu.get("horizon", horizon)
        c.tokenizer.update(vocab_size=1024, corpus_tasks=200)
        c.model.update(checkpoint="tiny", dtype="float32",
                       overrides=dict(num_layers=2, embed_dim=128, mlp_dim=320, num_heads=4,
                                      num_kv_heads=4, head_dim=32))
        c.prompt.update(role="", history_length=cpu.get("history_length", 0),
                        show_admissible=False, require_think=False, instruction="",
                        max_prompt_tokens=None)
        c.sft.update(steps=cpu.get("sft_steps", 2000), batch_size=16, learning_rate=3e-3,
                     warmup_steps=20, tasks=cpu.get("sft_tasks", 1500), check_every=250,
                     task_options=cpu["task_options"], expert_noise=cpu.get("expert_noise", 0.0),
                     expert_repeat=cpu.get("expert_repeat", 0.0))
        c.rl.update(steps=cpu.get("rl_steps", 60), tasks_per_step=6, max_new_tokens=24,
                    learning_rate=5e-4, weight_decay=0.0, mini_batch_size=None,
                    micro_batch_size=cpu.get("micro_batch_size"), entropy_coef=0.0,
                    drop_zero_advantage=True)
        c.eval.update(tasks=60, seeds=1, temperature=0.0, top_p=1.0, top_k=0)
        c.checkpoint.every = 10
    if arg.runlocal:
        c.env.train_tasks = 12
        c.tokenizer.update(vocab_size=512, corpus_tasks=12)
        c.model.overrides = dict(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2,
                                 num_kv_heads=2, head_dim=32)
        c.sft.update(steps=6, tasks=12, check_every=3)
        c.rl.update(steps=3, tasks_per_step=2, group_size=2, max_turns=min(horizon, 6),
                    batch_multiple=16, micro_batch_size=c.rl.micro_batch_size and 16)
        c.eval.tasks = 4
        c.checkpoint.every = 2
        c.metrics.tensorboard = False
    return c
