"""ReuseRL on Countdown-Stepwise (paper 003 §4, app. E–F.3): segmentation cost vs its baselines.

    python -m skilljax.train --config configs/reuserl_countdown.py:checkpoint=/models/Qwen2.5-1.5B-Instruct \
        --workdir /runs/reuserl_countdown --config.mesh=fsdp=8
    python -m skilljax.train --config configs/reuserl_countdown.py:cpu,variant=segcost --workdir /tmp/rc
    python launch/sweep.py configs/reuserl_countdown.py --arg cpu       # the four arms, 2 seeds

Paper settings: Qwen2.5-1.5B-Instruct, GRPO 300 steps, puzzles of 3–4 numbers with targets in
[10, 999], T = 30, reward 10, λ = 10, evaluation Pass@1 at temperature 0.4 over 3 runs on 1,024
test puzzles (Table 1: GRPO 68.46, round length 77.02, SegCost 80.37, SegCost w/o buffer 68.94).
Skill projection: 26 target-relative symbols (skills/projection.py).
CPU scale (`cpu`): a tiny policy on 3-number puzzles with targets up to 100, warm-started on expert
episodes; observations carry the pool, so no history is needed.

Arguments: `checkpoint`, `cpu`, `runlocal`, `seed`, `variant` (REUSE_VARIANTS: grpo, length,
segcost, segcost_no_buffer).
"""

from skilljax.config import REUSE_VARIANTS, parse_arg, reuserl_base


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, checkpoint="", cpu=False, runlocal=False, variant="segcost")
    return reuserl_base(
        arg, model="Qwen2.5-1.5B-Instruct", horizon=30,
        env=dict(name="countdown", eval_tasks=1024, history_length=4,
                 role="You are an expert at the Countdown numbers game, played one operation at "
                      "a time."),
        eval_sampling=dict(temperature=0.4),
        # The warm start's episodes take a random action a quarter of the time and the expert
        # recovers (Rollback / Reset): clean expert episodes never show a dead end, and a policy
        # trained on them loops on rejected actions after its first wrong operation.
        cpu=dict(train_tasks=2000, history_length=0, sft_tasks=3000, sft_steps=3000,
                 expert_noise=0.25,
                 task_options=dict(min_numbers=3, max_numbers=3, min_target=10, max_target=100)))


def sweep(add, arg=None):
    for seed in (0, 1):
        for variant in REUSE_VARIANTS:
            add(arg=f"variant={variant},seed={seed}")
