"""ReuseRL on TextWorld-Cooking (paper 003 §4, app. E–F.2): segmentation cost vs its baselines.

    python -m skilljax.train --config configs/reuserl_textworld_cooking.py:checkpoint=/models/Qwen3-1.7B \
        --workdir /runs/reuserl_cooking --config.mesh=fsdp=8
    python -m skilljax.train --config configs/reuserl_textworld_cooking.py:cpu --workdir /tmp/rt
    python launch/sweep.py configs/reuserl_textworld_cooking.py --arg cpu

Paper settings: Qwen3-1.7B in non-thinking mode, GRPO 300 steps, games mixed simple:hard 4:1,
T = 40, reward 10, λ = 10, evaluation Pass@1 with Qwen3's recommended sampling (temperature 0.7,
top-p 0.8, top-k 20) over 3 runs on 1,000 test games (Table 1: SegCost 81.73, w/o buffer 83.50).
Skill projection: 10 recipe-execution symbols (skills/projection.py).
CPU scale (`cpu`): a tiny policy on simple games (one room, one ingredient), warm-started on the
walkthroughs, with the last 4 turns as history.

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
        cpu=dict(train_tasks=400, history_length=4, sft_tasks=400,
                 task_options=dict(difficulty="simple"),
                 micro_batch_size=64))


def sweep(add, arg=None):
    for seed in (0, 1):
        for variant in REUSE_VARIANTS:
            add(arg=f"variant={variant},seed={seed}")
