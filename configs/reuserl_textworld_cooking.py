"""ReuseRL on TextWorld-Cooking (paper 003 §4, app. E–F.2): segmentation cost vs its baselines.

    python -m skilljax.train --config configs/reuserl_textworld_cooking.py:checkpoint=/models/Qwen3-1.7B \
        --workdir /runs/reuserl_cooking --config.mesh=fsdp=8
    python -m skilljax.train --config configs/reuserl_textworld_cooking.py:cpu --workdir /tmp/rt
    python launch/sweep.py configs/reuserl_textworld_cooking.py --arg cpu

Paper settings: Qwen3-1.7B in non-thinking mode, GRPO 300 steps, games mixed simple:hard 4:1,
T = 40, reward 10, λ = 10, evaluation Pass@1 with Qwen3's recommended sampling (temperature 0.7,
top-p 0.8, top-k 20) over 3 runs on 1,000 test games (Table 1: SegCost 81.73, w/o buffer 83.50).
Skill projection: 10 recipe-execution symbols (skills/projection.py).
CPU scale (`cpu`): a tiny policy on simple games (one room, one ingredient; walkthroughs of 5–10
commands), warm-started on the walkthroughs of 400 games, with the last 2 turns as history and
T = 20. Sizes set by the 2-core budget: with 4 turns of history and T = 40 an RL step took ~45 s
(each failed episode is 40 step samples of ~250 prompt tokens), 45 minutes a run; the warm start's
held-out NLL stops improving after ~500 of 2,000 steps (0.90 at 500, 1.00 at 2,000).

Arguments: `checkpoint`, `cpu`, `runlocal`, `seed`, `variant` (REUSE_VARIANTS).
"""

from skilljax.config import REUSE_VARIANTS, parse_arg, reuserl_base


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, checkpoint="", cpu=False, runlocal=False, variant="segcost")
    return reuserl_base(
        arg, model="Qwen3-1.7B", horizon=40,
        env=dict(name="textworld_cooking", eval_tasks=1000, history_length=4,
                 task_options=dict(difficulty="mixed"),
                 role="You are an expert agent playing a text cooking game."),
        eval_sampling=dict(temperature=0.7, top_p=0.8, top_k=20),
        cpu=dict(train_tasks=400, history_length=2, sft_tasks=400, sft_steps=1000, horizon=20,
                 task_options=dict(difficulty="simple"), micro_batch_size=64))


def sweep(add, arg=None):
    for seed in (0, 1):
        for variant in REUSE_VARIANTS:
            add(arg=f"variant={variant},seed={seed}")
