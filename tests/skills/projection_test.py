"""Skill projection φ: the paper's worked examples (ReuseRL app. F), alphabet sizes, expert play."""

import pytest

from skilljax.envs.base import Task
from skilljax.envs.chores import Chores
from skilljax.envs.countdown import Countdown
from skilljax.skills import projection as proj
from skilljax.skills.segmentation import OTHER


def test_alphabet_sizes_match_the_paper():
    assert {k: len(v) for k, v in proj.ALPHABETS.items() if k != "chores"} == \
        {"alfworld": 5, "textworld_cooking": 10, "countdown": 26}     # §4.2
    for alphabet in proj.ALPHABETS.values():
        assert len(set(alphabet)) == len(alphabet) and OTHER not in alphabet


def test_alfworld_worked_example():
    """App. F.1: "put a clean ladle on countertop 1"."""
    actions = ["go to drawer 1", "open drawer 1", "take ladle 1 from drawer 1", "go to sinkbasin 1",
               "clean ladle 1 with sinkbasin 1", "go to countertop 1", "put ladle 1 on countertop 1"]
    assert proj.project("alfworld", actions) == (
        "explore", "open", "take", "explore", "process", "explore", "put")
    assert proj.project("alfworld", ["move ladle 1 to countertop 1", "use desklamp 1",
                                     "heat egg 1 with microwave 1", "look", "jump"]) == (
        "put", "process", "process", "explore", OTHER)


def test_textworld_cooking_worked_example():
    """App. F.2."""
    actions = ["examine cookbook", "open fridge", "take carrot from fridge", "dice carrot",
               "cook carrot with stove", "prepare meal", "eat meal"]
    assert proj.project("textworld_cooking", actions) == (
        "read", "open", "take", "cut", "cook", "prepare", "eat")
    assert proj.project("textworld_cooking", ["go north", "examine knife", "inventory",
                                              "put knife on counter", "slice carrot with knife",
                                              "chop tomato", "close fridge", "xyzzy", ""]) == (
        "navigate", "observe", "observe", "drop", "cut", "cut", "open", OTHER, OTHER)


def test_countdown_worked_example_and_roles():
    """App. F.3: {80, 2, 28, 1} → 54; large > 59.4, near_target within 5.4, else small."""
    task = Task("t", "countdown", "test", {"numbers": [80, 2, 28, 1], "target": 54})
    assert [proj.role(n, 54) for n in (80, 59, 60, 49, 48, 2)] == \
        ["large", "near_target", "large", "near_target", "small", "small"]
    actions = ["op(-, 80, 28)", "op(+, 52, 2)", "op(*, 54, 1)"]
    assert proj.project("countdown", actions, task) == (
        "-(large,small)", "+(near_target,small)", "*(near_target,small)")
    # Operand order does not matter (the pair of roles is unordered: 4 × 6 + 2 = 26 symbols).
    assert proj.project("countdown", ["28 - 80", "2 + 52", "Rollback", "reset", "hello"], task) == (
        "-(large,small)", "+(near_target,small)", "rollback", "reset", OTHER)
    with pytest.raises(ValueError, match="target"):
        proj.project("countdown", ["1 + 2"])
    with pytest.raises(ValueError, match="No skill projection"):
        proj.projection("webshop")


@pytest.mark.parametrize("cls", [Chores, Countdown])
def test_expert_episodes_project_inside_the_alphabet(cls):
    env = cls()
    for task in cls.make_tasks("test", 12, seed=3):
        env.reset(task)
        actions, done = [], False
        while not done:
            actions.append(env.expert_action())
            done = env.step(actions[-1]).done
        symbols = proj.project(cls.name, actions, task)
        assert len(symbols) == len(actions)
        assert set(symbols) <= set(proj.ALPHABETS[cls.name]), (actions, symbols)
