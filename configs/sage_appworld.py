"""SAGE on the real AppWorld, for accelerator users with AppWorld installed in its own interpreter.

    python -m skilljax.train --config configs/sage_appworld.py:checkpoint=/models/Qwen2.5-7B-Instruct \
        --workdir /runs/sage_appworld --config.mesh=fsdp=8 \
        --config.env.python=$HOME/appworld-env/bin/python     # APPWORLD_ROOT set: see below
    python -m skilljax.train --config configs/sage_appworld.py:runlocal --workdir /tmp/sage_aw

Setup (skilljax/envs/apps/appworld_env.py): AppWorld installed with its data in a separate
environment (its pins conflict with the JAX stack), `APPWORLD_ROOT` pointing at its data, and
`env.python` naming that environment's interpreter; the env workers run there.

Method (paper 004, arXiv 2512.17102): GRPO with sequential rollouts over chains of N = 2 tasks of
one AppWorld scenario (`sage.chain_length`), each chain's functions validated and offered to its
next task, and the skill-integrated reward; evaluation plays whole test scenarios (TGC, SGC,
steps and tokens per scenario). The paper starts RL from a model fine-tuned on expert experience:
pass that checkpoint (`checkpoint=`); AppWorld has no expert here, so `sft.steps` is 0.
The stored text of the paper gives no optimiser settings; the GRPO settings below are the
project's released-SKILL0 defaults (lr 1e-6, G = 8, token-mean, invalid penalty 0.1, entropy
0.001, AdamW weight decay 0.01, 256 step samples per optimiser step) — change them to the
paper's when you have them. Arguments: `checkpoint` (required unless `runlocal`), `seed`,
`variant` (grpo / sequential / sage, as configs/sage_apps.py), `runlocal` (the same pipeline on
the offline `apps` env with a tiny random policy, for a machine without AppWorld).
"""

from skilljax.config import SAGE_VARIANTS, apply_sage_variant, base_config, parse_arg

VARIANTS = SAGE_VARIANTS


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, checkpoint="", runlocal=False, variant="sage")
    if not arg.checkpoint and not arg.runlocal:
        raise ValueError("configs/sage_appworld.py needs checkpoint=<HF directory of your "
                         "(fine-tuned) Qwen2.5 checkpoint> (weights are never downloaded), or "
                         "runlocal.")
    c = base_config()
    c.seed = arg.seed
    c.env.update(name="appworld", kwargs={"max_steps": 30}, train_tasks=90, workers=16)
    c.tokenizer.path = c.model.checkpoint = arg.checkpoint
    c.prompt.update(role="You are an agent that completes tasks on a phone's apps by writing "
                         "Python code against their APIs.",
                    format="code", history_length=30, show_admissible=False,
                    max_prompt_tokens=8192)
    c.skills.enabled = False
    c.sft.steps = 0
    c.rl.update(max_turns=30, max_new_tokens=1024)
    c.sage.update(chain_length=2)
    c.eval.update(tasks=168)  # test_normal: 56 scenarios of 3

    if arg.runlocal:  # the same pipeline on the offline apps env, a tiny random policy
        c.env.update(name="apps", workers=2, kwargs={}, train_tasks=12)
        c.tokenizer.update(path="", vocab_size=512, corpus_tasks=9)
        c.model.update(checkpoint="tiny", dtype="float32")
        c.model.overrides.update(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2,
                                 num_kv_heads=2, head_dim=32)
        c.prompt.update(history_length=1, max_prompt_tokens=None)
        c.sft.update(steps=3, tasks=9, batch_size=8, learning_rate=1e-3, chains=True)
        c.rl.update(steps=2, tasks_per_step=2, group_size=2, max_turns=2, max_new_tokens=24,
                    learning_rate=1e-4, mini_batch_size=4, micro_batch_size=None,
                    batch_multiple=4)
        c.eval.tasks = 6
        c.checkpoint.every = 1
        c.metrics.tensorboard = False
    apply_sage_variant(c, arg.variant)  # last: the grpo arm's tasks per step follow the rest
    return c


def sweep(add, arg=None):
    # launch/sweep.py configs/sage_appworld.py --arg checkpoint=/models/... : the arms
    for variant in VARIANTS:
        add(arg=f"variant={variant}")
