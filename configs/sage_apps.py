"""SAGE at CPU scale on `apps` (paper 004's method on the offline AppWorld-style env).

    python -m skilljax.train --config configs/sage_apps.py --workdir /tmp/sage
    python -m skilljax.train --config configs/sage_apps.py:runlocal --workdir /tmp/sage_local
    python launch/sweep.py configs/sage_apps.py --workdir /tmp/sage_sweep   # 3 arms x 2 seeds

The policy is the default experiment's tiny model (configs/default.py), trained from scratch:
1. a byte-level BPE tokenizer on expert chains' prompts and code;
2. a supervised warm start on expert chains over whole scenarios (three tasks of one template):
   the first task's code defines a function and calls it, the later tasks see that function
   listed and only call it (the paper starts RL from a model fine-tuned on expert experience);
3. GRPO (lr 1e-4: at 5e-4 a trial's entropy rose from 0.08 to 0.69 in 13 steps; docs/results.md).
   Arms (`variant=`): `grpo` plays every task on its own (twice the tasks per step, so every arm
   trains on the same number of episodes); `sequential` plays chains of the
   first two tasks of a scenario, the functions of a solved first task offered to the second,
   with the env reward only; `sage` adds the skill-integrated reward (R1 = r1 + 1[r1=1]1[r2=1]
   1_skill(q2|q1), R2 = r2 + 1[r2=1]1_skill(q2), times the env's success reward);
4. evaluation on held-out scenarios played whole as chains, with libraries passed ("with
   skills") and without: TGC (success_rate), SGC (scenario_success_rate), steps and generated
   tokens per scenario, skill use on later tasks.
Responses are `<code>...</code>` cells (prompt.format="code"); a cell runs in the episode's
sandbox (envs/apps/sandbox.py). Hardware: 2 CPU cores. Results: docs/results.md (SAGE section).
"""

from skilljax.config import SAGE_VARIANTS, apply_sage_variant, base_config, parse_arg

VARIANTS = SAGE_VARIANTS


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, runlocal=False, variant="sage")
    c = base_config()
    c.seed = arg.seed
    c.env.update(name="apps", workers=2, timeout_s=60.0, train_tasks=300)  # 100 scenarios
    c.tokenizer.update(vocab_size=1024, corpus_tasks=120)
    c.model.update(checkpoint="tiny", dtype="float32", remat="none", scan_layers=False)
    c.sampler.max_batch = 0
    c.model.overrides.update(num_layers=2, embed_dim=128, mlp_dim=320, num_heads=4,
                             num_kv_heads=4, head_dim=32, attention_block=0)
    # One history record: after an error, the failed cell and its message.
    c.prompt.update(format="code", history_length=1, show_admissible=False, instruction="",
                    max_prompt_tokens=None)
    c.skills.enabled = False
    c.sft.update(steps=3000, learning_rate=3e-3, warmup_steps=20, tasks=600, check_every=250,
                 target_heldout_nll=0.05, with_skills=False, chains=True)
    c.rl.update(steps=40, tasks_per_step=4, group_size=8, max_turns=2, max_new_tokens=96,
                learning_rate=1e-4, weight_decay=0.0, clip_high=0.28, entropy_coef=0.0,
                mini_batch_size=None, micro_batch_size=None, advantage="grpo",
                drop_zero_advantage=True)
    c.sage.update(chain_length=2)
    c.eval.update(tasks=60, temperature=0.0, seeds=1)  # 20 scenarios, played whole
    c.checkpoint.keep = 2
    if arg.runlocal:
        c.env.train_tasks = 24
        c.tokenizer.update(corpus_tasks=18, vocab_size=512)
        c.model.overrides.update(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2,
                                 num_kv_heads=2, head_dim=32)
        c.sft.update(steps=10, tasks=30, batch_size=16, check_every=5)
        c.rl.update(steps=3, tasks_per_step=2, group_size=2, batch_multiple=16)
        c.eval.tasks = 6
        c.checkpoint.every = 2
        c.metrics.tensorboard = False
    apply_sage_variant(c, arg.variant)  # last: the grpo arm's tasks per step follow the rest
    return c


def sweep(add, arg=None):
    for seed in (0, 1):
        for variant in VARIANTS:
            add(arg=f"variant={variant},seed={seed}")
