"""Countdown-Stepwise: task splits, hand-checked step semantics, the expert, a random baseline."""

import json
import random
import subprocess
import sys

import pytest

from skilljax.envs import base
from skilljax.envs.countdown import Countdown, parse_action, solve

# ReuseRL app. F.3's worked example: {80, 2, 28, 1} → 54 by 80 − 28, 52 + 2, 54 · 1.
PAPER = base.Task(id="paper", type="countdown_4", split="test",
                  payload={"numbers": [80, 2, 28, 1], "target": 54})


def _task(numbers, target):
    return base.Task(id="t", type=f"countdown_{len(numbers)}", split="test",
                     payload={"numbers": numbers, "target": target})


@pytest.fixture(scope="module")
def test_tasks():
    return Countdown.make_tasks("test", 50, seed=0)


def _play(env, task, policy):
    env.reset(task)
    while True:
        result = env.step(policy())
        if result.done:
            return result


# ----------------------------------------------------------------------------- tasks


def test_make_tasks_deterministic_prefix_and_seeded(test_tasks):
    again = Countdown.make_tasks("test", 50, seed=0)
    assert again == test_tasks
    assert Countdown.make_tasks("test", 20, seed=0) == test_tasks[:20]   # prefixes of one stream
    other = Countdown.make_tasks("test", 50, seed=1)
    assert len({t.id for t in other} & {t.id for t in test_tasks}) < 5   # seeds give new puzzles
    assert len({t.id for t in test_tasks}) == 50
    for t in test_tasks:
        numbers, target = t.payload["numbers"], t.payload["target"]
        assert t.split == "test" and t.type == f"countdown_{len(numbers)}"
        assert 3 <= len(numbers) <= 4 and 10 <= target <= 999         # ReuseRL app. E
        assert all(isinstance(n, int) and n > 0 for n in numbers)
        assert solve(tuple(sorted(numbers)), target) is not None
        assert base.Task.from_json(json.loads(json.dumps(t.to_json()))) == t
    assert {t.type for t in test_tasks} == set(Countdown.task_types())


def test_train_and_test_never_share_a_puzzle(test_tasks):
    def keys(tasks):
        return {(tuple(sorted(t.payload["numbers"])), t.payload["target"]) for t in tasks}

    train0 = Countdown.make_tasks("train", 150, seed=0)
    train1 = Countdown.make_tasks("train", 100, seed=1)
    assert all(t.split == "train" for t in train0)
    assert not keys(train0) & keys(test_tasks)
    assert not keys(train1) & keys(test_tasks)   # the split is by content, so across seeds too
    with pytest.raises(ValueError):
        Countdown.make_tasks("valid", 1)


def test_expert_solutions_score_full_marks_with_reasoning_gym(test_tasks):
    """Our success (pool == [target]) agrees with reasoning_gym's own scorer on expert plans."""
    import reasoning_gym

    scorer = reasoning_gym.create_dataset("countdown", size=1, seed=0)
    env = Countdown()
    for task in test_tasks:
        env.reset(task)
        exprs = [(n, str(n)) for n in task.payload["numbers"]]   # (value, expression) multiset
        while True:
            result = env.step(env.expert_action())
            op = result.info["op"]
            i = next(k for k, (v, _) in enumerate(exprs) if v == op["a"])
            ea = exprs.pop(i)[1]
            j = next(k for k, (v, _) in enumerate(exprs) if v == op["b"])
            eb = exprs.pop(j)[1]
            exprs.append((op["result"], f"({ea} {op['operator']} {eb})"))
            if result.done:
                break
        assert result.won and len(exprs) == 1
        assert scorer.score_answer(exprs[0][1], {"metadata": task.payload}) == 1.0


# ----------------------------------------------------------------------------- actions


@pytest.mark.parametrize("text,expected", [
    ("80 - 28", ("op", (80, "-", 28, None))),
    ("  80-28 ", ("op", (80, "-", 28, None))),
    ("12 * 7", ("op", (12, "*", 7, None))),
    ("12 X 7", ("op", (12, "*", 7, None))),
    ("12 × 7 = 84.", ("op", (12, "*", 7, 84))),
    ("12 ÷ 3", ("op", (12, "/", 3, None))),
    ("`9 + 4`", ("op", (9, "+", 4, None))),
    ("OP(-, 80, 28)", ("op", (80, "-", 28, None))),
    ("op(*,54,1)", ("op", (54, "*", 1, None))),
    ("Rollback", ("rollback", None)),
    ("ROLL BACK.", ("rollback", None)),
    (" reset ", ("reset", None)),
    ("80 - 28 - 2", ("bad", None)),
    ("I think 80 - 28", ("bad", None)),
    ("", ("bad", None)),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_paper_example_step_by_step():
    env = Countdown()
    obs, info = env.reset(PAPER)
    assert obs == "Target: 54. Numbers: 80, 2, 28, 1."
    assert info["valid"] and info["pool"] == [80, 2, 28, 1] and info["op"] is None
    assert "80 - 28" in info["admissible_actions"] and "Rollback" not in info["admissible_actions"]

    r = env.step("80 - 28")
    assert r.observation == "80 - 28 = 52. Target: 54. Numbers: 2, 1, 52."
    assert (r.reward, r.done, r.won) == (0.0, False, False)
    assert r.info["op"] == {"kind": "op", "a": 80, "operator": "-", "b": 28, "result": 52}
    assert r.info["pool_before"] == [80, 2, 28, 1] and r.info["pool"] == [2, 1, 52]
    assert r.info["target"] == 54 and r.info["valid"] and "Rollback" in r.info["admissible_actions"]

    r = env.step("op(+, 52, 2)")
    assert r.info["pool"] == [1, 54] and not r.done
    r = env.step("54 * 1")
    assert r.observation == "54 * 1 = 54. Target: 54. Numbers: 54."
    assert (r.reward, r.done, r.won, r.truncated) == (10.0, True, True, False)   # ReuseRL app. E
    assert r.info["admissible_actions"] == []
    json.dumps(r.to_json())
    with pytest.raises(base.EnvError):
        env.step("Reset")


@pytest.mark.parametrize("action,error", [
    ("80 - 3", "numbers not in the pool"),
    ("28 - 28", "numbers not in the pool"),          # only one 28: operands come from the multiset
    ("28 / 3", "numbers not in the pool"),
    ("80 / 28", "result not a positive integer"),    # not exact
    ("2 - 28", "result not a positive integer"),     # negative
    ("80 - 28 = 53", "wrong result"),
    ("subtract 28 from 80", "unparsable action"),
    ("Rollback", "nothing to roll back"),
])
def test_invalid_actions_cost_a_step_and_change_nothing(action, error):
    env = Countdown()
    env.reset(PAPER)
    r = env.step(action)
    assert r.observation == "Nothing happens. Target: 54. Numbers: 80, 2, 28, 1."
    assert r.observation.startswith(Countdown.invalid_observation)
    assert (r.reward, r.done, r.won) == (0.0, False, False)
    assert not r.info["valid"] and r.info["error"] == error and r.info["op"] is None
    assert r.info["pool"] == [80, 2, 28, 1] and r.info["steps"] == 1 and env.steps == 1


def test_exact_division_and_duplicate_numbers():
    env = Countdown()
    env.reset(_task([10, 40, 13, 10], 520))
    r = env.step("10 / 10")
    assert r.info["valid"] and r.info["pool"] == [40, 13, 1]
    r = env.step("40 / 1")
    assert r.info["pool"] == [13, 40]


def test_rollback_and_reset():
    env = Countdown()
    env.reset(PAPER)
    env.step("80 - 28")
    env.step("52 + 2")
    r = env.step("Rollback")
    assert r.observation == "Rolled back 52 + 2 = 54. Target: 54. Numbers: 2, 1, 52."
    assert r.info["valid"] and r.info["pool"] == [2, 1, 52] and r.info["pool_before"] == [1, 54]
    assert r.info["op"] == {"kind": "rollback", "undone": {"kind": "op", "a": 52, "operator": "+",
                                                         "b": 2, "result": 54}}
    env.step("2 * 1")
    r = env.step("reset")
    assert r.observation == "Reset. Target: 54. Numbers: 80, 2, 28, 1."
    assert r.info["op"] == {"kind": "reset"} and r.info["pool_before"] == [52, 2]
    assert "Rollback" not in r.info["admissible_actions"]   # Reset clears the history
    r = env.step("Rollback")
    assert not r.info["valid"] and env.steps == 6


def test_step_limit_truncates():
    env = Countdown()
    env.reset(PAPER)
    for _ in range(29):
        r = env.step("nonsense")
        assert not r.done
    r = env.step("nonsense")   # the 30th action (ReuseRL app. E: T = 30)
    assert (r.done, r.truncated, r.won, r.reward) == (True, True, False, 0.0)
    env = Countdown(max_steps=3)
    env.reset(PAPER)
    env.step("80 - 28"), env.step("52 + 2")
    r = env.step("54 * 1")     # winning on the last step is a win, not a truncation
    assert (r.done, r.truncated, r.won, r.reward) == (True, False, True, 10.0)


def test_stuck_with_one_number_left():
    env = Countdown()
    env.reset(_task([5, 3, 2], 10))
    env.step("5 + 3"), env.step("8 * 2")                     # pool [16], not the target
    assert env.admissible_actions() == ["Rollback", "Reset"]
    assert env.expert_action() == "Rollback"                 # 8, 2 → 8 + 2 = 10
    r = env.step("16 + 1")                                   # ReuseRL app. G.2: "Stuck"
    assert (r.done, r.won, r.truncated) == (True, False, False) and r.info["stuck"]
    assert r.observation.startswith("Nothing happens.")

    env.reset(_task([5, 3, 2], 10))
    env.step("5 + 3"), env.step("8 * 2")
    r = env.step("Rollback")                                 # the way out stays open
    assert r.info["valid"] and not r.done and not r.info["stuck"]

    env = Countdown(stuck_ends=False)
    env.reset(_task([5, 3, 2], 10))
    env.step("5 + 3"), env.step("8 * 2")
    r = env.step("blah")
    assert not r.done and not r.info["valid"] and not r.info["stuck"]


def test_admissible_actions_exact_and_all_valid(test_tasks):
    env = Countdown()
    env.reset(_task([6, 3, 3], 12))
    assert env.admissible_actions() == ["6 + 3", "6 - 3", "6 * 3", "6 / 3",
                                        "3 + 3", "3 * 3", "3 / 3", "Reset"]
    rng = random.Random(0)
    for task in test_tasks[:10]:
        env.reset(task)
        for _ in range(6):
            actions = env.admissible_actions()
            assert len(actions) == len(set(actions))
            for action in actions:   # probe every action on a copy of the state
                probe = Countdown()
                probe.reset(task)
                probe.pool, probe.history = list(env.pool), list(env.history)
                assert probe.step(action).info["valid"], (env.pool, action)
            if env.step(rng.choice(actions)).done:
                break


# ----------------------------------------------------------------------------- policies


def test_expert_wins_every_test_task_in_the_fewest_steps(test_tasks):
    env = Countdown()
    for task in test_tasks:
        r = _play(env, task, env.expert_action)
        assert r.won and r.reward == 10.0
        assert env.steps == len(task.payload["numbers"]) - 1   # every op removes one number


def test_expert_recovers_from_random_moves(test_tasks):
    env = Countdown()
    rng = random.Random(1)
    recovered = 0
    for task in test_tasks:
        env.reset(task)
        for _ in range(rng.randint(1, 8)):
            r = env.step(rng.choice(env.admissible_actions()))
            if r.done:
                break
        else:
            recovered += 1
            moves = env.steps
            while not r.done:
                r = env.step(env.expert_action())
            assert r.won, task
            assert env.steps - moves <= 4   # ≤ 1 Rollback/Reset, then at most 3 ops
    assert recovered >= 40


def test_random_policy_wins_far_less_than_the_expert(test_tasks):
    env = Countdown()
    rng = random.Random(0)
    wins = sum(_play(env, t, lambda: rng.choice(env.admissible_actions())).won for t in test_tasks)
    # 19/50 = 0.38 with this seed (0.20–0.38 over seeds 0–5): Rollback and Reset keep it alive
    # for 30 steps, so it does win some; the expert wins 50/50.
    assert 5 <= wins <= 25


def test_registered_and_importable_without_jax():
    assert isinstance(base.make("countdown"), Countdown)
    code = ("import sys, skilljax.envs.countdown as c; c.Countdown.make_tasks('train', 2); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
