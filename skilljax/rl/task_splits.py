"""A run's task lists: training tasks, the curriculum's validation tasks and the test tasks.

Validation tasks measure each skill file's helpfulness Δ_k (SKILL0 §3.3); they come from
`skills.val_split` (the released code validates ALFWorld on `valid_seen` and Search on questions drawn
from the test split, `shared/reference/skill0_released_code.md` §3.5) and are never a training task:
a task's identity is its type and payload, whatever its id.
"""

from __future__ import annotations

import json

from skilljax.envs import base as envs_base
from skilljax.skills.bank import SkillBank


def task_content(task: envs_base.Task) -> str:
    """What makes two tasks the same task: the type and the payload, whatever their ids."""
    return json.dumps([task.type, task.payload], sort_keys=True, default=str)


def validation_tasks(c, train_tasks) -> list:
    """The curriculum's helpfulness tasks: `skills.val_tasks_per_type` per task type from split
    `skills.val_split` (another seed than training), never a training task (by content)."""
    cls = envs_base.env_class(c.env.name)
    seen = {task_content(t) for t in train_tasks}
    per_type = c.skills.val_tasks_per_type
    candidates = cls.make_tasks(c.skills.val_split, per_type * 12, seed=c.seed + 7919,
                                **dict(c.env.task_options))
    val, count = [], {}
    for t in candidates:
        if task_content(t) not in seen and count.get(t.type, 0) < per_type:
            val.append(t)
            count[t.type] = count.get(t.type, 0) + 1
    assert not seen & {task_content(t) for t in val}
    return val


def check_validation_covers(bank: SkillBank, val_tasks, split: str) -> None:
    """Every skill file must be scored at every curriculum update: a file none of whose task
    types is among the validation tasks gets no Δ and is dropped at the first update."""
    types = {t.type for t in val_tasks}
    for name in bank.file_names:
        served = bank.task_types_of(name)
        if not types & set(served):
            raise ValueError(
                f"Skill file {name!r} serves task types {list(served)}, but the validation tasks "
                f"(skills.val_split={split!r}) hold none of them ({sorted(types)}): the curriculum "
                "could never score it and would drop it at its first update. Validate on a split "
                "that has them (--config.skills.val_split=...; with Search-R1 data the training "
                "questions have no PopQA rows, so validate on 'test' as the released code does).")


def run_tasks(c) -> tuple[list, list, list]:
    """(training, validation, test) tasks of a run's config."""
    cls = envs_base.env_class(c.env.name)
    opts = dict(c.env.task_options)
    train_tasks = cls.make_tasks("train", c.env.train_tasks, seed=c.seed, **opts)
    val = validation_tasks(c, train_tasks) if c.skills.enabled else []
    test_tasks = cls.make_tasks(c.env.test_split, c.eval.tasks, seed=c.seed, **opts)
    return train_tasks, val, test_tasks
