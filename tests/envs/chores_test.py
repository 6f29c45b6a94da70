import random

import pytest

from skilljax.envs import base
from skilljax.envs.chores import BENCHMARK, Chores, procedure_text


def play(env, task, policy, rng=None):
    env.reset(task)
    while True:
        action = env.expert_action() if policy == "expert" else rng.choice(env.admissible_actions())
        r = env.step(action)
        if r.done:
            return r


def test_tasks_are_deterministic_balanced_and_splits_disjoint():
    a = Chores.make_tasks("train", 60, seed=3)
    assert a == Chores.make_tasks("train", 60, seed=3)
    assert a != Chores.make_tasks("train", 60, seed=4)
    assert [t.type for t in a[:6]] == list(BENCHMARK)
    key = lambda t: (t.type, t.payload["object"], t.payload["dest"], t.payload["object_room"])
    train = {key(t) for t in Chores.make_tasks("train", 600, seed=0)}
    test = {key(t) for t in Chores.make_tasks("test", 600, seed=0)}
    assert train and test and not train & test


def test_step_semantics_by_hand():
    task = base.Task("t", "clean", "test", dict(
        verb="clean", object="mug", object_room="kitchen", dest="desk", steps=["soap", "basin"],
        start_room="kitchen", distractors={"garage": ["key"]}, goal="clean the mug and put it in the desk.",
        procedure=procedure_text("clean", ("soap", "basin"), "desk")))
    env = Chores()
    obs, info = env.reset(task)
    assert info["goal"] == "clean the mug and put it in the desk."
    assert obs == "You are in the kitchen. You hold: nothing."
    assert "take mug" in info["admissible_actions"] and "use sink" in info["admissible_actions"]
    assert "put mug in desk" not in info["admissible_actions"]  # nothing held yet
    r = env.step("use sink")  # the decoy: the kitchen sink does not clean
    assert r.observation.startswith("Nothing happens.") and r.info["valid"] and r.info["progress"] == 0
    r = env.step("fly to the moon")
    assert r.observation.startswith("Nothing happens.") and not r.info["valid"] and not r.done
    assert env.step("Take the mug.").info["held"] == "mug"  # case, article and period tolerated
    r = env.step("use basin")  # walks to the bathroom, but out of order
    assert r.info["progress"] == 0 and r.info["room"] == "bathroom"
    assert r.observation.startswith("You walk to the bathroom. Nothing happens.")
    r = env.step("use soap")
    assert r.info["progress"] == 1 and r.observation.endswith("You hold: mug (used: soap).")
    r = env.step("use basin")
    assert r.info["progress"] == 2 and "It is ready." in r.observation
    assert r.observation.endswith("You hold: mug (used: soap, basin; ready).")
    r = env.step("put mug in desk")
    assert r.done and r.won and r.reward == 10.0 and "Task complete." in r.observation
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_putting_an_untreated_object_does_not_win_and_limit_truncates():
    task = Chores.make_tasks("test", 1, seed=0)[0]  # a clean task
    env = Chores()
    env.reset(task)
    for _ in range(Chores.max_steps - 1):
        r = env.step("nonsense")
        assert not r.done and r.reward == 0.0
    r = env.step("nonsense")
    assert r.done and r.truncated and not r.won and r.reward == 0.0


def test_expert_wins_everything_random_policy_rarely():
    env = Chores()
    for source in ("benchmark", "random"):
        tasks = Chores.make_tasks("test", 120, seed=1, source=source)
        assert all(play(env, t, "expert").won for t in tasks)
        rng = random.Random(0)
        rate = sum(play(env, t, "random", rng).won for t in tasks) / len(tasks)
        assert rate < 0.08, rate  # measured 0.013 / 0.0 on 300 tasks


def test_expert_recovers_from_any_state():
    env, rng = Chores(), random.Random(1)
    for task in Chores.make_tasks("train", 60, seed=2):
        env.reset(task)
        for _ in range(5):
            if env.step(rng.choice(env.admissible_actions())).done:
                break
        else:
            while not (r := env.step(env.expert_action())).done:
                pass
            assert r.won


def test_random_procedures_carry_their_text_and_avoid_benchmark_verbs():
    tasks = Chores.make_tasks("train", 50, seed=0, source="random")
    verbs = {t.payload["verb"] for t in tasks}
    assert len(verbs) > 5 and not verbs & {s["verb"] for s in BENCHMARK.values()}
    t = tasks[0]
    assert t.payload["procedure"] == procedure_text(t.payload["verb"], tuple(t.payload["steps"]),
                                                    t.payload["dest"])
    assert f"use {', '.join(t.payload['steps'])}" in t.payload["procedure"]


def test_convention_verbs_have_one_procedure_each():
    from skilljax.envs.chores import CONVENTION_VERBS, RANDOM_VERBS, convention_steps
    tasks = Chores.make_tasks("train", 80, seed=0, source="convention")
    assert {t.type for t in tasks} == {"convention"}
    by_verb = {}
    for t in tasks:
        by_verb.setdefault(t.payload["verb"], set()).add(tuple(t.payload["steps"]))
    assert len(by_verb) > 6 and all(len(v) == 1 for v in by_verb.values())
    assert {v for (v,) in map(tuple, by_verb.values())} == {convention_steps(v) for v in by_verb}
    assert not set(CONVENTION_VERBS) & (set(RANDOM_VERBS) | {s["verb"] for s in BENCHMARK.values()})
    env = Chores()
    for t in tasks[:10]:
        env.reset(t)
        done = won = False
        while not done:
            r = env.step(env.expert_action())
            done, won = r.done, r.won
        assert won


def test_bad_options():
    with pytest.raises(ValueError, match="splits"):
        Chores.make_tasks("valid", 1)
    with pytest.raises(ValueError, match="source"):
        Chores.make_tasks("train", 1, source="nope")
