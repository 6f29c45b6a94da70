"""SkillForge at CPU scale on `chores`: skills called by name from a catalog, evolved by a rule-based
teacher from an empty bank (paper 002's method; its LLM teacher replaced by
`skilljax.skills.rule_teacher`, which induces skills from trajectories alone).

    python -m skilljax.train --config configs/skillforge_chores.py --workdir /tmp/skillforge
    python -m skilljax.train --config configs/skillforge_chores.py:runlocal --workdir /tmp/sf_local
    python launch/sweep.py configs/skillforge_chores.py          # the arms below, two seeds

The policy is the default experiment's tiny model (configs/default.py), with its warm start changed
in one way: skills never appear as text in the prompt. Each randomised-procedure episode instead
shows a catalog of four skills (call name and trigger) — the task's own, as the rule teacher would
induce it from the task's expert episode, and three of other tasks — and the expert appends
`<skill>NAME</skill>` to every action; the skill's content then arrives in the next observation.
So the policy learns to pick the skill whose trigger matches its task, call it, and follow what
comes back. RL (GiGPO, as the default experiment) starts with an empty bank: the teacher induces a
skill for a task type once `min_support` successes of that type share an action chain, revises
skills whose conf(s) is high, and the catalog offers them from the next step.

Arms (`variant=`, `sweep()`): `skillforge` (the method), `no_skills` (GRPO, the bank stays empty),
`no_reflexion`, `no_contrastive`, `fixed_bank` (the hand-written bank
`skilljax/data/skills/chores/skillforge_bank.json`, never evolved; statistics still tracked).
Evaluation: held-out tasks with the final bank's catalog ("with skills") and without a catalog.
Hardware: 2 CPU cores. Expected time and results: docs/results.md (SkillForge section).
"""

from skilljax.config import apply_variant, config_module, parse_arg

VARIANTS = {
    "skillforge": {},
    "no_skills": {"evolution.evolve": False},
    "no_reflexion": {"evolution.reflexion": False},
    "no_contrastive": {"evolution.contrastive": False},
    "fixed_bank": {"evolution.initial_bank": "skills/chores/skillforge_bank.json",
                   "evolution.evolve": False},
}


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, runlocal=False, variant="skillforge")
    c = config_module("default.py").get_config(f"seed={arg.seed}"
                                               + (",runlocal" if arg.runlocal else ""))
    # No skill text in prompts and no SKILL0 curriculum: skills come only through the catalog.
    c.skills.enabled = False
    c.reuse.enabled = False
    c.evolution.update(
        enabled=True, initial_bank="", embedder="tfidf",
        general_k=2, specific_k=3,  # short catalogs for the tiny policy (paper: 6 + 6)
        instruction="",             # the warm start taught the calling; no instruction text
        every=5, types_per_induction=6, abstract_per_type=4, max_new_skills=1,
        review_after_uses=10)
    c.evolution.teacher.update(kind="rule", min_support=2)
    # Warm-start catalogs hold only the task's own skill: with three distractors the tiny policy
    # had not learned to copy the right name by the 4,500-step budget (held-out NLL 0.075; it
    # wrote other tasks' names, or text, inside the tag). During RL a task's catalog holds only
    # skills of its type, usually one.
    c.sft.catalog_distractors = 0
    # Skills called by id (s0007), one name vocabulary for the warm start and RL: with
    # `<verb>_steps` names the warm-started policy wrote warm-start verbs' names and never copied
    # a benchmark skill's name from the catalog (docs/results.md, SkillForge diagnosis).
    c.evolution.call_names = "id"
    c.rl.steps = 120
    # Responses carry a call after the action ("<action>use heater</action><skill>heat_steps
    # </skill>", up to ~18 tokens of the trained tokenizer): 16 would cut the tag (invalid).
    c.rl.max_new_tokens = 32
    apply_variant(c, VARIANTS, arg.variant)
    if arg.runlocal:
        c.rl.steps = 4
        c.evolution.update(every=2, review_after_uses=1, reflexion_min_conf=0.0)
        c.evolution.teacher.min_support = 1
    return c


def sweep(add, arg=None):
    for seed in (0, 1):
        for variant in VARIANTS:
            add(arg=f"variant={variant},seed={seed}")
