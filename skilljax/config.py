"""Config files: loading with command-line overrides, a workdir's resolved config, and the helpers
shared by the files in configs/ (big_vision style).

A config file defines `get_config(arg)` → ConfigDict (and optionally `sweep(add, arg)`);
`load_config("configs/x.py:arg", ["--config.a.b=v", ...])` calls it and applies the overrides.
A run writes its resolved config to `WORKDIR/config.json`; `workdir_config(WORKDIR)` reads it back,
so tools that act on a finished run (evaluate, export_hf) need only `--workdir`.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
from pathlib import Path

import ml_collections
from etils import epath

# ---------------------------------------------------------------------------- the schema

# Nodes whose keys are free-form (env constructor arguments, task generator options): set whole.
OPEN = ("env.kwargs", "env.task_options", "sft.task_options")

# QwenConfig fields a config may override (None: the preset's or the checkpoint's value).
_MODEL_FIELDS = dict(vocab_size=int, embed_dim=int, mlp_dim=int, num_layers=int, num_heads=int,
                     num_kv_heads=int, head_dim=int, model_type=str, rope_theta=float,
                     rms_norm_eps=float, tie_embeddings=bool, qkv_bias=bool, out_bias=bool,
                     qk_norm=bool, max_position_embeddings=int, initializer_range=float,
                     attention_block=int, logits_block=int)


def base_config() -> ml_collections.ConfigDict:
    """Every config key, once, with its default: the released SKILL0 ALFWorld settings where the
    key is theirs (`shared/reference/skill0_released_code.md`). Experiment files in configs/ start
    from it and set only what differs. Locked: setting an unknown key is an error."""
    placeholder = ml_collections.config_dict.placeholder
    c = ml_collections.ConfigDict()
    c.seed = 0                        # model init, task sampling, rollouts, curriculum ties
    c.mesh = ""                       # device mesh, e.g. "fsdp=8" or "data=2,tensor=4"; "" = one device
    # Compiled programs kept on disk and reused by later runs (and after jit_cache.trim); "" = off.
    c.compilation_cache_dir = "~/.cache/skilljax/xla"
    c.env = dict(
        name="chores",                # environment (skilljax.envs registry)
        workers=16,                   # env worker processes of the pool
        timeout_s=300.0,              # a worker that takes longer for one call is an error
        kwargs={},                    # env constructor arguments, e.g. {"max_steps": 50}
        task_options={},              # task generator options (training, validation and test)
        train_tasks=3000,             # size of the training task pool
        test_split="test",            # split the test tasks come from
        python="",                    # env workers' interpreter ("" = this one; AppWorld's own)
    )
    c.tokenizer = dict(
        path="",                      # directory with tokenizer.json; "" = train one on env text
        vocab_size=0,                 # vocabulary of a trained tokenizer
        corpus_tasks=0,               # expert episodes in a trained tokenizer's corpus
    )
    c.model = dict(
        checkpoint="",                # HF directory, or a preset name ("tiny") for a random init
        dtype="bfloat16",             # compute dtype (every matmul)
        param_dtype="float32",        # parameter storage: float32 master weights (AdamW follows)
        remat="full",                 # kept for the backward pass per layer: none, full or dots
        scan_layers=True,             # one lax.scan over the layers (compile time flat in depth)
        lora=dict(rank=0, alpha=16.0,  # rank > 0: train only low-rank adapters on `targets`
                  targets=("q", "k", "v", "o", "gate", "up", "down")),
        overrides={k: placeholder(t) for k, t in _MODEL_FIELDS.items()},  # QwenConfig fields
    )
    c.sampler = dict(
        max_batch=128,                # rows per generate chunk (bounds the KV cache); 0 = all
        share_prefix_min=16,          # prompts sharing >= this many leading tokens prefill them once; 0 = off
        compact=True,                 # rows still decoding go on in a smaller batch once half have stopped
    )
    c.prompt = dict(
        role="",                      # first line of every prompt ("" = none)
        history_length=2,             # previous (observation, action) pairs shown
        show_admissible=True,         # list the env's admissible actions
        require_think=True,           # responses must hold <think>...</think> before the action
        instruction=None,             # response-format instruction; None = the format's own
        max_prompt_tokens=4096,       # longer prompts are cut from the history; None = no limit
        format="think_action",        # "think_action", "search_answer" or "code" (apps)
    )
    c.sft = dict(                     # the supervised warm start (skilljax.rl.warm_start)
        steps=0,                      # optimizer steps (a budget with check_every); 0 = none
        batch_size=16,                # step samples per optimizer step
        learning_rate=1e-5,           # peak AdamW learning rate (cosine decay)
        warmup_steps=0,               # linear warm-up steps
        tasks=0,                      # expert episodes (a tenth more, held out, for the checks)
        check_every=0,                # held-out NLL every n steps; 0 = never
        target_heldout_nll=0.0,       # stop once the held-out NLL is below this
        with_skills=True,             # show each episode's skill text
        task_options={},              # the warm-start tasks' generator options
        without_skills_fraction=0.0,  # share of episodes shown without skill text
        bare_task_options=None,       # generator options (or a list) of those episodes
        bare_after_nll=0.0,           # they join once the held-out NLL is below it; 0 = from step 1
        expert_noise=0.0,             # rate of random (not trained on) actions in expert episodes
        expert_repeat=0.0,            # share of those that repeat the previous action
        prompt_loss_weight=0.0,       # weight of the prompt tokens' mean NLL in the loss
        cache_dir="",                 # share warm starts between runs with equal inputs
        catalog_distractors=3,        # SkillForge: other tasks' skills in each episode's catalog
        chains=False,                 # SAGE: expert chains (library passed) over whole scenarios
    )
    c.rl = dict(
        steps=180,                    # RL steps
        tasks_per_step=16,            # tasks (groups) per step
        group_size=8,                 # rollouts per task (G)
        max_turns=50,                 # episode step limit (at most the env's; 0 = the env's)
        max_new_tokens=512,           # response tokens per env step
        temperature=1.0,              # rollout sampling
        top_p=1.0,
        top_k=0,
        learning_rate=1e-6,           # AdamW
        weight_decay=0.01,
        grad_clip=1.0,                # global gradient norm
        clip_low=0.2,                 # PPO ratio clip 1 - clip_low ...
        clip_high=0.2,                # ... 1 + clip_high
        dual_clip=3.0,                # dual-clip bound for negative advantages; None = off
        loss_agg="token-mean",        # token-mean, seq-mean-token-mean or seq-mean-token-sum
        entropy_coef=0.001,           # entropy bonus
        kl_coef=0.0,                  # KL to the initial policy
        kl_kind="k3",                 # k1, k2 or k3
        mini_batch_size=256,          # step samples per optimizer step; None = the whole batch
        micro_batch_size=8,           # step samples per gradient accumulation slice; None = all
        ppo_epochs=1,                 # passes over the batch
        recompute_old_logp=True,      # old logprobs from the learner, not the sampler
        behaviour_is_cap=0.0,         # loss × min(π_old / π_sampler, cap) per token (TIS); 0 = off
        max_staleness=0,              # rollouts run ahead of the learner by up to n steps; 0 = sync
        env_overlap=False,            # half the episodes step their envs while half sample
        advantage="grpo",             # grpo, drgrpo, rloo or gigpo
        group_stats="trajectory",     # "trajectory" (SKILL0 eq. 5) or "step" (released code)
        gigpo_gamma=0.95,             # GiGPO: discount of step returns
        gigpo_mode="mean_norm",       # GiGPO: step-group normalisation
        gigpo_step_weight=1.0,        # GiGPO: weight of the step advantage
        invalid_penalty=0.1,          # reward of an invalid action (subtracted)
        drop_zero_advantage=False,    # leave samples with advantage 0 out of the batch
        batch_multiple=64,            # batch rows padded to a multiple of this
    )
    c.skills = dict(                  # in-context skills and the SKILL0 curriculum
        enabled=True,                 # skill text in prompts (off: no curriculum)
        dir="",                       # skill bank directory; "" = the env's own bank
        validate_every=10,            # curriculum update every d steps
        num_stages=3,                 # budget stages N_S
        budgets=None,                 # explicit budgets per stage; None = paper eq. 6
        filter=True,                  # drop files with negative helpfulness
        rank="delta",                 # "delta" or "random"
        fixed_full=False,             # every file, never withdrawn
        keep_general=True,            # the general file first, taking one budget slot
        strict=False,                 # keep only files with helpfulness > 0
        val_tasks_per_type=22,        # validation tasks per task type
        val_split="train",            # split the validation tasks come from
        clamp_start=True,             # the first stage keeps every file
        validate_at_start=False,      # the released code's update before step 1
        track_full_set=True,          # also validate with every file, for plots
    )
    c.eval = dict(
        tasks=128,                    # test tasks
        temperature=0.4,              # 0 = greedy
        top_p=1.0,
        top_k=0,
        samples_per_task=1,           # k of pass@k / SC@k
        seeds=1,                      # evaluation passes with different env seeds
    )
    c.reuse = dict(                   # ReuseRL: skill dictionary and segmentation cost
        enabled=False,                # extract the dictionary from successes (and log it)
        **reuse_section("none"),
    )
    c.evolution = dict(               # SkillForge (paper 002): catalog, skill calls, evolution
        enabled=False,                # catalog in prompts, <skill> calls, per-skill evidence
        initial_bank="",              # "" = empty; "env" = the env's markdown bank; a bank.json
        evolve=True,                  # induction / reflexion every `every` steps (off: fixed bank)
        general_k=6,                  # catalog: top general skills k_g
        specific_k=6,                 # catalog: top skills of the task's type k_s
        instruction=None,             # the catalog's calling instruction; None = the default
        call_names="title",           # "title" (from the teacher's name / title) or "id" (s0007)
        embedder="auto",              # "auto", "tfidf" or a sentence-transformers model dir
        every=5,                      # I: steps between evolution steps
        alpha=0.1,                    # EMA smoothing of p̂ (eq. 7)
        half_life=20.0,               # usage half-life h of conf(s) (eq. 8)
        max_new_skills=3,             # per induction call
        induction=True,               # multi-pathway induction
        contrastive=True,             # the contrastive pathway (off: extraction instead)
        dedup=True,                   # drop induced skills that duplicate the bank
        reflexion=True,               # keep / revise the highest-conf skills
        types_per_induction=1,        # task types (most failures first) induced per evolution
        abstract_per_type=4,          # episodes abstracted per task type and outcome
        buffer_size=8,                # abstractions kept per task type and outcome
        reflexion_top=2,              # skills reviewed per evolution step
        reflexion_min_conf=0.05,      # ... with conf(s) at least this
        review_after_uses=5,          # new uses before a skill is reviewed again
        reflexion_contexts=3,         # usage episodes shown per review
        dedup_lexical=0.8,            # word-overlap (Jaccard) threshold of deduplication
        dedup_semantic=0.9,           # embedding-cosine threshold of deduplication
        answer_retries=2,             # extra tries for a malformed teacher answer
        domain="",                    # named in the teacher prompts
        domain_rules="",              # domain guidance in the teacher prompts
        teacher=dict(
            kind="rule",              # rule, http, local, policy or replay
            base_url="",              # http: OpenAI-compatible base URL (or $SKILLJAX_TEACHER_URL)
            model="",                 # http: model name (or $SKILLJAX_TEACHER_MODEL)
            api_key_env="OPENAI_API_KEY",  # http: environment variable holding the key
            timeout_s=60.0,           # http: per request
            retries=2,                # http: transport retries
            concurrency=4,            # http: requests in flight
            checkpoint="",            # local: HF directory of the teacher model
            max_new_tokens=1024,      # local / policy / http: answer length
            temperature=0.0,
            replay_from="",           # replay: a run's skills/teacher_cache.jsonl
            min_support=2,            # rule: successes that must share a pattern
        ),
    )
    c.sage = dict(                    # SAGE (paper 004): chains of tasks with a skill library
        enabled=False,                # play chains of one scenario's tasks (env with scenarios)
        chain_length=2,               # N: tasks per training chain (evaluation: whole scenarios)
        library=True,                 # pass each chain's functions to its next task
        reward=True,                  # the skill-integrated reward (off: the env reward only)
        validate=True,                # re-run functions in a fresh sandbox before they join
    )
    c.visual = dict(                  # SKILL0's visual context (Qwen2.5-VL policies)
        enabled=False,                # the history as an image in each prompt, not as text
        width=0,                      # image width in px; 0 = the env's (ALFWorld 392, Search 560)
        font_size=0,                  # 0 = the env's (ALFWorld 10, Search 12)
        highlights="",                # "marker:r,g,b;..." marker colours; "" = the env's
        padding=5,                    # white border (px) after compression
        min_pixels=3136,              # the processor's resize bounds (multiples of 28 px)
        max_pixels=2048 * 2048,       # ... (the released path caps the area at 2048^2)
        agent_compression=True,       # the agent picks each next image's <compression> factor
        compression_coef=0.01,        # reward coef * ln(cf) on successful trajectories
        compression_failure_coef=0.0,  # ... minus this * ln(cf) on failed ones
        compression_every=8,          # the reward on every n-th RL step only
        expert_compression=1.0,       # the factor expert warm-start responses write
        skills_in_image=False,        # draw the skill text above the history (paper) or not (code)
    )
    c.checkpoint = dict(
        every=10,                     # RL steps between checkpoints
        keep=3,                       # checkpoints kept
    )
    c.metrics = dict(
        tensorboard=True,             # also write TensorBoard events
        wandb_project="",             # a W&B project: also log there (pip install wandb)
        wandb_mode="",                # "online", "offline" (sync later) or "" (WANDB_MODE / W&B's)
        progress="auto",              # progress bars: "auto" (when stderr is a terminal), "on", "off"
    )
    c.lock()
    for path in OPEN:
        _node(c, path).unlock()
    return c


def _node(c, path: str):
    for p in path.split("."):
        c = c[p]
    return c


def _leaves(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in OPEN:
            out |= _leaves(v, key + ".")
        else:
            out.add(key)
    return out


def check_schema(config: ml_collections.ConfigDict, source: str = "the config") -> None:
    """Every key of `base_config()` present and nothing else (free-form nodes aside): a config
    file that replaced a section instead of updating it, or added a key, fails here."""
    want, have = _leaves(to_dict(base_config())), _leaves(to_dict(config))
    missing, extra = sorted(want - have), sorted(have - want)
    if missing or extra:
        hints = {k: difflib.get_close_matches(k, sorted(want), n=1, cutoff=0.6) for k in extra}
        extra_s = ", ".join(f"{k} (did you mean {h[0]}?)" if h else k for k, h in hints.items())
        raise ValueError(f"{source} does not match the config schema (skilljax.config."
                         f"base_config): " + "; ".join(
                             part for part in (f"unknown keys: {extra_s}" if extra else "",
                                               f"missing keys: {', '.join(missing)}" if missing
                                               else "") if part)
                         + ". Start from base_config() and set sections with .update(...).")


def merge(config: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
    """Set nested `values` into `config` key by key (free-form nodes replaced whole)."""
    def go(node, vals, prefix):
        for k, v in vals.items():
            key = f"{prefix}{k}"
            if k not in node:
                raise _no_key(key, k, node)
            if isinstance(v, dict) and key not in OPEN and isinstance(node[k], ml_collections.ConfigDict):
                go(node[k], v, key + ".")
            else:
                node[k] = v
    go(config, values, "")
    return config


# ---------------------------------------------------------------------------- loading


def load_config(spec: str, overrides: list[str] | None = None) -> ml_collections.ConfigDict:
    """`configs/x.py[:arg]` → its get_config(arg), then `--config.a.b=value` overrides."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Config file {path!r} not found.")
    config = _exec_module(path).get_config(arg or None)
    check_schema(config, f"{path}'s get_config({arg!r})")
    apply_overrides(config, overrides or [])
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str]) -> None:
    for item in overrides:
        if not item.startswith("--config."):
            raise ValueError(f"Unknown argument {item!r}; overrides look like --config.a.b=value.")
        key, sep, value = item[len("--config."):].partition("=")
        if not sep:
            raise ValueError(f"Override {item!r} needs a value: --config.{key}=VALUE.")
        set_path(config, key, value)


def _no_key(key: str, missing: str, node) -> KeyError:
    close = difflib.get_close_matches(missing, list(node.keys()), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(k) for k in close)}? " if close else ""
    return KeyError(f"--config.{key}: no {missing!r} in the config; {hint}"
                    f"(keys there: {sorted(node.keys())}).")


def set_path(config: ml_collections.ConfigDict, key: str, value: str) -> None:
    """Set `a.b.c` to `value` (a Python literal, or else the string), typed like the old value."""
    node = config
    for p in key.split(".")[:-1]:
        if p not in node:
            raise _no_key(key, p, node)
        node = node[p]
    leaf = key.split(".")[-1]
    if leaf not in node:
        raise _no_key(key, leaf, node)
    old = node[leaf]
    if old is None:  # a typed placeholder (e.g. model.overrides.remat) converts like its type
        kind = node.get_type(leaf)
        old = {bool: False, int: 0, float: 0.0, str: ""}.get(kind, None)
        if kind is str:
            node[leaf] = value
            return
    try:
        new = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        new = value
    if isinstance(old, bool) and isinstance(new, str):
        if new.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"--config.{key}={value!r}: expected true or false.")
        new = new.lower() in ("1", "true", "yes")
    elif isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
        new = float(new)
    node[leaf] = new


# ---------------------------------------------------------------------------- a workdir's config


def to_dict(config: ml_collections.ConfigDict) -> dict:
    """The config as plain JSON types (tuples become lists)."""
    return json.loads(config.to_json_best_effort())


def write_json(path, obj) -> None:
    """Write JSON through a temporary file and a rename: a crash never leaves half a file.
    `path` may be local or remote (`etils.epath`, e.g. gs://)."""
    path = epath.Path(path)
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def workdir_config(workdir, overrides: list[str] | None = None) -> ml_collections.ConfigDict:
    """The resolved config a run wrote to `WORKDIR/config.json`, with `--config.a.b=v` overrides
    (e.g. evaluation settings)."""
    path = epath.Path(workdir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {workdir} a skilljax.train workdir? Runs "
                                f"write their config there when they start; for an older run "
                                f"pass --config configs/x.py[:arg] (the config it was trained "
                                f"with).")
    try:
        config = merge(base_config(), _migrate(json.loads(path.read_text())))
    except KeyError as e:
        raise KeyError(f"{path} has a key this version of the schema does not know ({e}); pass "
                       f"--config configs/x.py[:arg], the config the run was trained with.") from e
    apply_overrides(config, overrides or [])
    return config


def _migrate(values: dict) -> dict:
    """A config.json written by an older version, in today's keys."""
    model = values.get("model", {})
    remat = model.get("overrides", {}).pop("remat", None)
    if remat is not None:  # model.overrides.remat (bool) became model.remat (a policy)
        model["remat"] = "full" if remat else "none"
    if model and "param_dtype" not in model:  # dtype used to set the storage too
        model["param_dtype"] = model.get("dtype", "float32")
    return values


def config_module(name: str):
    """Another file of configs/ as a module (a config built on another's get_config)."""
    return _exec_module(Path(__file__).resolve().parent.parent / "configs" / name)


def _exec_module(path: str | os.PathLike):
    """A config file's module, executed from its path."""
    spec = importlib.util.spec_from_file_location(f"skilljax_configs_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_files(root: str | os.PathLike | None = None) -> list[str]:
    """The experiment config files shipped in configs/ (for --help)."""
    root = Path(root) if root else Path(__file__).resolve().parent.parent / "configs"
    return sorted(p.name for p in root.glob("*.py") if not p.name.startswith("_"))


def config_arguments(path: str | os.PathLike) -> dict[str, Any]:
    """The `configs/x.py:arg` options of a config file (name → default), read from its
    get_config's `parse_arg(arg, ...)` call without running it; {} when it has none."""
    import ast
    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "parse_arg":
            out = {}
            for kw in node.keywords:
                if kw.arg and kw.arg != "lazy":
                    try:
                        out[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        out[kw.arg] = ast.unparse(kw.value)
            return out
    return {}


def cli_help(workdir_tool: bool = False) -> str:
    """The --help epilog of the tools that take `--config`: the shipped config files with their
    arguments, and the override syntax."""
    root = Path(__file__).resolve().parent.parent / "configs"
    lines = ["config files (configs/x.py[:arg], arg = comma-separated options of the file):"]
    for name in config_files(root):
        args = config_arguments(root / name)
        shown = ", ".join(k if v is False else f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                          for k, v in args.items())
        lines.append(f"  {name:<28} {shown}")
        try:  # the arms of its sweep (a config file imports only this module)
            spec = importlib.util.spec_from_file_location(f"_help_{name[:-3]}", root / name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if getattr(module, "VARIANTS", None):
                lines.append(f"  {'':<28} variant: {' | '.join(module.VARIANTS)}")
        except Exception:  # noqa: BLE001  (help must print whatever a config file does)
            pass
    lines += [
        "",
        "e.g. --config configs/default.py:runlocal,seed=1,variant=no_skills (a bare option is a",
        "flag; `variant` takes the names in the file's VARIANTS). Any config key is then set with",
        "--config.section.key=value (a Python literal, else a string; typed like the key's",
        "default), e.g. --config.rl.steps=240 --config.skills.filter=false; an unknown key is an",
        "error that names the closest keys."]
    if workdir_tool:
        lines += ["Without --config, the workdir's config.json (the run's resolved config) is "
                  "used;", "overrides apply on top of it."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- config-file helpers


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


# SAGE's arms (paper 004): GRPO on single tasks, sequential rollouts over chains with the env
# reward only, and SAGE (sequential rollouts with the skill-integrated reward).
SAGE_VARIANTS: dict[str, dict[str, object]] = {
    "grpo": {"sage.enabled": False},
    "sequential": {"sage.enabled": True, "sage.reward": False},
    "sage": {"sage.enabled": True, "sage.reward": True},
}


def apply_sage_variant(config: ml_collections.ConfigDict, name: str) -> None:
    """A SAGE arm (`SAGE_VARIANTS`), with the same episodes per RL step in every arm: the `grpo`
    arm plays single tasks, so it draws `sage.chain_length` times as many of them per step as a
    chain arm draws scenarios (each of which is played as a chain of that many tasks)."""
    apply_variant(config, SAGE_VARIANTS, name)
    if not config.sage.enabled:
        config.rl.tasks_per_step *= config.sage.chain_length


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
    c = base_config()
    c.seed = arg.seed
    c.env.update(name=env["name"], kwargs={"max_steps": horizon},
                 task_options=dict(env.get("task_options", {})), train_tasks=5000,
                 test_split=env.get("test_split", "test"))
    c.tokenizer.path = c.model.checkpoint = arg.checkpoint
    c.prompt.update(role=env["role"], history_length=env.get("history_length", 2),
                    show_admissible=env.get("show_admissible", True), max_prompt_tokens=4096)
    c.sft.with_skills = False
    c.rl.update(steps=300, max_turns=horizon, clip_high=0.28, invalid_penalty=0.01)
    # No in-context skills: ReuseRL's skills are the dictionary's phrases, not texts.
    c.skills.update(enabled=False, val_tasks_per_type=4)
    c.eval.update(tasks=env.get("eval_tasks", 256), seeds=3, **eval_sampling)
    c.reuse.enabled = True
    c.checkpoint.update(every=20, keep=2)
    apply_variant(c, REUSE_VARIANTS, arg.variant)

    if arg.cpu or arg.runlocal:
        c.env.update(workers=2, train_tasks=cpu["train_tasks"], task_options=cpu["task_options"])
        c.env.kwargs.max_steps = c.rl.max_turns = cpu.get("horizon", horizon)
        c.tokenizer.update(vocab_size=1024, corpus_tasks=200)
        c.model.update(checkpoint="tiny", dtype="float32")
        c.model.overrides.update(num_layers=2, embed_dim=128, mlp_dim=320, num_heads=4,
                                 num_kv_heads=4, head_dim=32)
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
        c.model.overrides.update(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2,
                                 num_kv_heads=2, head_dim=32)
        c.sft.update(steps=6, tasks=12, check_every=3)
        c.rl.update(steps=3, tasks_per_step=2, group_size=2, max_turns=min(horizon, 6),
                    batch_multiple=16, micro_batch_size=c.rl.micro_batch_size and 16)
        c.eval.tasks = 4
        c.checkpoint.every = 2
        c.metrics.tensorboard = False
    return c
