"""Task lists of a run: validation tasks are never training tasks and score every skill file."""

import pytest

from skilljax.rl import task_splits
from skilljax.config import load_config
from tests.conftest import ROOT

CONFIG = str(ROOT / "configs" / "default.py")


def test_validation_tasks_are_never_training_tasks():
    from skilljax.envs.base import env_class
    c = load_config(CONFIG)
    train_tasks, val, _ = task_splits.run_tasks(c)
    content = {task_splits.task_content(t) for t in train_tasks}
    assert val and not content & {task_splits.task_content(t) for t in val}
    assert {t.type for t in val} == set(env_class("chores").task_types())
    # Candidates that are training tasks are skipped, whatever their ids.
    again = task_splits.validation_tasks(c, val)
    assert again and not {task_splits.task_content(t) for t in val} & {
        task_splits.task_content(t) for t in again}


def test_every_skill_file_must_be_scored():
    from skilljax.envs.search_qa import SearchQA
    from skilljax.skills.bank import SkillBank
    bank = SkillBank.for_env("search_qa")
    no_attribute = [t for t in SearchQA.make_tasks("train", 12) if t.type != "attribute"]
    with pytest.raises(ValueError, match="'attribute_lookup' serves task types \\['attribute'\\]"):
        task_splits.check_validation_covers(bank, no_attribute, "train")
    c = load_config(str(ROOT / "configs" / "search_skill0.py") + ":runlocal")
    train_tasks, val, _ = task_splits.run_tasks(c)
    task_splits.check_validation_covers(bank, val, c.skills.val_split)  # the released split: test
