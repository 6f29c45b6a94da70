"""ReuseRL on ALFWorld (paper 003 §4, app. E–F.1): segmentation cost vs its baselines.

    python -m skilljax.train --config configs/reuserl_alfworld.py:checkpoint=/models/Qwen2.5-1.5B-Instruct \
        --workdir /runs/reuserl_alfworld --config.mesh=fsdp=8
    python -m skilljax.train --config configs/reuserl_alfworld.py:cpu --workdir /tmp/ra
    python launch/sweep.py configs/reuserl_alfworld.py --arg cpu

Paper settings: Qwen2.5-1.5B-Instruct, GRPO 300 steps, T = 50, reward 10, λ = 10, evaluation
SC@7 (majority of 7 samples) at temperature 0.4 on valid_seen (IID, 140 games) and valid_unseen
(OOD, 134; `eval_split=valid_unseen`) (Table 1: SegCost 97.14 / 93.28). Skill projection: 5
navigation/manipulation symbols (skills/projection.py). Games: `$ALFWORLD_DATA` or synthesized
offline (needs `pip install -e .[envs]`).
CPU scale (`cpu`): a tiny policy on synthesized games of all six types in rooms of at most 20
receptacles (task option `max_receptacles`; expert episodes 5-40 steps, mean 13), warm-started for
2,000 steps on the expert episodes of 300 games, with the last 2 turns as history, the admissible
commands in the prompt (as the paper's prompt) and T = 40. The warm-start episodes take a random
admissible command 20 % of the time, half of those instead repeating the previous command (often
rejected: "Nothing happens."), and the expert recovers (`sft.expert_noise`, `sft.expert_repeat`).
Evaluation at the paper's temperature 0.4 (greedy decoding makes a repeated rejected command an
absorbing loop), two episodes per game. Even so the policy starts near the floor (0.03-0.08 on
60 valid_seen games): see the ALFWorld paragraph of docs/results.md.

Arguments: `checkpoint`, `cpu`, `runlocal`, `seed`, `eval_split`, `variant` (REUSE_VARIANTS).
"""

from skilljax.config import REUSE_VARIANTS, parse_arg, reuserl_base


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, checkpoint="", cpu=False, runlocal=False, variant="segcost",
                    eval_split="valid_seen")
    c = reuserl_base(
        arg, model="Qwen2.5-1.5B-Instruct", horizon=50,
        env=dict(name="alfworld", eval_tasks=140, history_length=50, test_split=arg.eval_split,
                 role="You are an expert agent operating in the ALFRED embodied environment."),
        eval_sampling=dict(temperature=0.4),
        cpu=dict(train_tasks=300, history_length=2, sft_tasks=300, sft_steps=2000, horizon=40,
                 task_options={"max_receptacles": 20}, micro_batch_size=64, expert_noise=0.2,
                 expert_repeat=0.5))
    if not (arg.cpu or arg.runlocal):
        c.eval.update(samples_per_task=7, seeds=1)  # SC@7
    if arg.cpu:
        c.prompt.show_admissible = True
        c.eval.update(temperature=0.4, seeds=2)
    if arg.runlocal:
        c.env.update(train_tasks=6, kwargs={"max_steps": 4})
        c.sft.update(tasks=3, steps=3)
        c.eval.tasks = 3
    return c


def sweep(add, arg=None):
    for seed in (0, 1):
        for variant in REUSE_VARIANTS:
            add(arg=f"variant={variant},seed={seed}")
