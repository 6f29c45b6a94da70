"""SKILL0 on ALFWorld with the released launch settings (`scripts/train_alfworld_skillzero_3b.sh`).

    python -m skilljax.train --config configs/alfworld_skill0.py:checkpoint=/models/Qwen2.5-7B-Instruct \
        --workdir /runs/alfworld_7b --config.mesh=fsdp=8
    python -m skilljax.train --config configs/alfworld_skill0.py:runlocal --workdir /tmp/alfworld_local

Released settings (`shared/reference/skill0_released_code.md` §4.2, §7.1): Qwen2.5(-VL)-3B/7B-
Instruct, lr 1e-6, G = 8 rollouts of the same game per group, 16 games per step, budgets [6, 3, 0]
over 180 steps with validation every 10 (the set chosen at a validation applies to the following
steps), temperature 1.0 in training and 0.4 (sampled) in validation, invalid-action penalty 0.1,
token-mean loss, no KL, entropy 0.001, AdamW weight decay 0.01, one optimiser step per 256 step
samples (`ppo_mini_batch_size`), old logprobs recomputed by the learner, validation on
`valid_seen`, 50 steps per episode with the whole episode as history,
`<think>`/`<action>` responses ≤ 512 tokens. Two paths:
- text (the default): the history as text, prompts ≤ 5120 tokens as the released text scripts;
  use the text-only Instruct checkpoints.
- `visual` (the released SKILL0 default): the history as an image (392 px wide, DejaVu Sans Mono
  10, `[Observation]` blue / `[Action]` red) for a Qwen2.5-VL-3B/7B-Instruct checkpoint, prompts
  ≤ 3072 tokens, the agent's `<compression>` factor for each next image and the reward
  0.01 · ln(cf) on successful trajectories every 8th step (§5, §7.1):

      python -m skilljax.train --config configs/alfworld_skill0.py:checkpoint=/models/Qwen2.5-VL-7B-Instruct,visual \
          --workdir /runs/alfworld_vl_7b --config.mesh=fsdp=8

Games: your ALFWorld data when `$ALFWORLD_DATA` is set (`alfworld-download`'s layout), otherwise
games synthesized offline from the `alfworld` package (`pip install -e .[envs]`); evaluation on
`valid_seen` (in-distribution, what SKILL0 reports; `eval_split=valid_unseen` for out-of-
distribution).

Arguments: `checkpoint` (HF directory with the model and tokenizer.json; required unless
`runlocal`), `seed`, `variant` (VARIANTS: the paper's ablations), `eval_split`, `visual`,
`runlocal` (with `visual`: a tiny random Qwen2.5-VL policy).
Hardware: the released runs used 4 GPUs (80 GB); on TPU use an fsdp mesh over the slice.
"""

from skilljax.config import apply_variant, base_config, parse_arg, skill0_variants

VARIANTS = skill0_variants(6)  # five task-family files + general skills


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, checkpoint="", eval_split="valid_seen", runlocal=False,
                    variant="curriculum", visual=False)
    if not arg.checkpoint and not arg.runlocal:
        raise ValueError("configs/alfworld_skill0.py needs checkpoint=<HF directory of "
                         "Qwen2.5-3B/7B-Instruct> (weights are never downloaded), or runlocal.")
    c = base_config()  # the schema's defaults are these released settings; the rest:
    c.seed = arg.seed
    c.env.update(name="alfworld", kwargs={"max_steps": 50}, test_split=arg.eval_split)
    c.tokenizer.path = c.model.checkpoint = arg.checkpoint
    c.prompt.update(role="You are an expert agent operating in the ALFRED embodied environment.",
                    history_length=50, max_prompt_tokens=5120)
    c.skills.update(budgets=(6, 3, 0),
                    val_tasks_per_type=22,  # ≈ the released 128 validation games
                    val_split="valid_seen")
    apply_variant(c, VARIANTS, arg.variant)
    if arg.visual:  # the released visual run: history image, agent-chosen compression
        c.visual.enabled = True
        c.prompt.max_prompt_tokens = 3072

    if arg.runlocal:  # the same pipeline, a tiny random policy, a handful of synthesized games
        c.env.update(workers=2, train_tasks=6, kwargs={"max_steps": 4})
        c.tokenizer.update(path="", vocab_size=700, corpus_tasks=3)
        c.model.update(checkpoint="tiny", dtype="float32")
        c.model.overrides.update(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2,
                                 num_kv_heads=2, head_dim=32)
        c.prompt.update(history_length=2, max_prompt_tokens=None)
        c.sft.update(steps=3, tasks=3, batch_size=8, learning_rate=1e-3)
        c.rl.update(steps=2, tasks_per_step=2, group_size=2, max_turns=4, max_new_tokens=12,
                    learning_rate=1e-4, mini_batch_size=4, micro_batch_size=None,
                    batch_multiple=4)
        c.skills.update(validate_every=2, val_tasks_per_type=1)
        c.eval.tasks = 3
        c.checkpoint.every = 1
        c.metrics.tensorboard = False
        if arg.visual:  # the "tiny" decoder with a 2-block tower; small images
            c.model.checkpoint = "tiny_vl"
            c.model.overrides.update(embed_dim=None, mlp_dim=None, num_heads=None,
                                     head_dim=None, num_layers=1)
            c.visual.max_pixels = 28 * 28 * 64
    return c


def sweep(add, arg=None):
    for variant in VARIANTS:
        add(arg=f"variant={variant}")
