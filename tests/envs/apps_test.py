"""The apps environment: worlds, templates, state-based judging, the expert, chains' libraries."""

import dataclasses
import itertools
import random

import pytest

from skilljax.envs import base
from skilljax.envs.apps import api, tasks as apps_tasks
from skilljax.envs.apps.env import Apps
from skilljax.envs.play import play


@pytest.fixture(scope="module")
def env():
    e = Apps()
    yield e
    e.close()


def _task(template, split="test", k=0):
    tasks = Apps.make_tasks(split, 3 * len(apps_tasks.TEMPLATES), seed=k)
    return next(t for t in tasks if t.type == template)


def test_registered_and_tasks_grouped_in_scenarios():
    assert base.env_class("apps") is Apps
    tasks = Apps.make_tasks("train", 12, seed=3)
    assert tasks == Apps.make_tasks("train", 12, seed=3)
    assert [t.payload["position"] for t in tasks] == [0, 1, 2] * 4
    for scenario in (tasks[i:i + 3] for i in range(0, 12, 3)):
        assert len({t.payload["scenario"] for t in scenario}) == 1
        assert len({t.type for t in scenario}) == 1
        assert len({t.payload["world_seed"] for t in scenario}) == 1
        first = apps_tasks.TEMPLATES[scenario[0].type].arguments[0]
        assert len({t.payload["params"][first] for t in scenario}) == 3  # three different tasks
    test = Apps.make_tasks("test", 12, seed=3)
    assert not {t.payload["world_seed"] for t in tasks} & {t.payload["world_seed"] for t in test}
    assert len(Apps.make_tasks("test", 7)) == 7
    assert {t.type for t in Apps.make_tasks("test", 6, templates="pay_contact+buy_product")} == \
        {"pay_contact", "buy_product"}
    with pytest.raises(ValueError, match="Unknown apps templates"):
        Apps.make_tasks("test", 3, templates="fly_plane")
    with pytest.raises(ValueError, match="splits"):
        Apps.make_tasks("val", 3)


def test_contact_names_never_contain_one_another():
    # The expert finds a contact with contacts.search(name)[0]: no name may be part of another.
    names = [f"{f} {l}" for f, l in itertools.product(apps_tasks.FIRST, apps_tasks.LAST)]
    assert not [(a, b) for a in names for b in names if a != b and a.lower() in b.lower()]
    products = apps_tasks.PRODUCTS
    assert not [(a, b) for a in products for b in products if a != b and a in b]


@pytest.mark.parametrize("template", sorted(apps_tasks.TEMPLATES))
def test_expert_solves_every_template(env, template):
    task = _task(template)
    obs, info = env.reset(task, seed=0)
    assert "apis.supervisor.complete_task" in obs and info["goal"]
    code = env.expert_action()
    assert f"def {template}(" in code  # no library: the expert writes its function
    r = env.step(code)
    assert r.done and r.won and r.reward == env.success_reward, r.observation


def test_state_based_judging(env):
    task = _task("pay_contact")
    p = task.payload["params"]
    env.reset(task)
    r = env.step("apis.supervisor.complete_task()")  # nothing done
    assert r.done and not r.won and r.info["tables_wrong"] == ["payments"]

    # Right payment plus an unasked one: the extra change fails the task.
    env.reset(task)
    r = env.step(f"c = apis.contacts.search({p['name']!r})[0]\n"
                 f"apis.payments.send(c['id'], {p['amount']}, {p['note']!r})\n"
                 "apis.payments.send(c['id'], 1, 'tip')\napis.supervisor.complete_task()")
    assert r.done and not r.won

    # The same payment over two cells succeeds.
    env.reset(task)
    r = env.step(f"c = apis.contacts.search({p['name']!r})[0]")
    assert not r.done and r.info["valid"] and r.info["cell_ok"]
    r = env.step(f"apis.payments.send(c['id'], {p['amount']}, {p['note']!r})\n"
                 "apis.supervisor.complete_task()")
    assert r.won


def test_answers(env):
    task = _task("count_events")
    env.reset(task)
    code = env.expert_action()
    defined = code.rsplit("\n", 1)[0]
    name = task.payload["params"]["name"]
    r = env.step(defined + f"\nn = count_events({name!r})\nprint(n)")
    n = int(r.observation.strip().splitlines()[-1])
    assert n >= 1 and not r.done
    assert env.step(f"apis.supervisor.complete_task(answer='{n} ')").won  # a numeric string
    env.reset(task)
    assert not env.step(f"apis.supervisor.complete_task(answer={n + 1})").won
    env.reset(task)
    r = env.step("apis.supervisor.complete_task()")  # a question needs an answer
    assert r.done and not r.won and r.info["answer_ok"] is False
    assert apps_tasks.answers_match("'Lisbon'", "' lisbon'")
    assert not apps_tasks.answers_match(None, "3")
    assert apps_tasks.answers_match("7", None)


def test_code_errors_and_limits(env):
    env.reset(_task("buy_product"))
    r = env.step("def broken(:\n  pass")
    assert not r.done and not r.info["valid"] and r.observation.startswith("SyntaxError")
    r = env.step("apis.shop.buy(999, 1)")
    assert r.info["valid"] and not r.info["cell_ok"] and "no product with id 999" in r.observation
    r = env.step("open('/etc/passwd').read()")
    assert "PermissionError" in r.observation
    r = env.step("while True: pass")  # the last step: truncated, and the env still serves
    assert r.done and r.truncated and not r.won and "time limit exceeded" in r.observation
    env.reset(_task("buy_product"))
    assert env.step(env.expert_action()).won


def test_agent_code_cannot_open_the_database(env):
    env.reset(_task("move_contact"))
    r = env.step(f"import sqlite3\nsqlite3.connect({env._db!r}).execute('DELETE FROM contacts')")
    assert "PermissionError" in r.observation
    assert not env.step("apis.supervisor.complete_task()").won


def test_library_code_is_defined_and_listed(env):
    scenario = [t for t in Apps.make_tasks("train", 6) if t.type == "total_paid"] or \
        [t for t in Apps.make_tasks("train", 36) if t.type == "total_paid"]
    first, second = scenario[0], scenario[1]
    env.reset(first)
    code = env.expert_action()
    assert env.step(code).won
    library = apps_tasks.TEMPLATES["total_paid"].function.strip()
    chained = dataclasses.replace(second, payload=dict(second.payload, library_code=library))
    obs, _ = env.reset(chained)
    assert "total_paid(name)" in obs
    code2 = env.expert_action()
    assert "def " not in code2 and "total_paid(" in code2
    assert env.step(code2).won
    # Without the library the same call fails: names live only in their chain.
    env.reset(second)
    r = env.step(code2)
    assert not r.won and "NameError" in r.observation


def test_play_expert_and_random_report_scenarios():
    expert = play("apps", "expert", episodes=12, workers=1, split="test")
    assert expert["success_rate"] == 1.0 and expert["scenario_success_rate"] == 1.0
    assert expert["scenarios"] == 4
    rand = play("apps", "random", episodes=12, workers=1, split="test")
    assert rand["scenario_success_rate"] <= 0.05


def test_api_docs_and_errors():
    conn = api.create(":memory:")
    apps_tasks.build_world(conn, 5)
    apis = api.Apis(conn)
    assert "contacts" in apis.api_docs.show_app_descriptions()
    assert "apis.shop.buy(product_id: int, quantity: int = 1)" in \
        apis.api_docs.show_api_descriptions("shop")
    with pytest.raises(api.APIError, match="no app 'bank'"):
        apis.api_docs.show_api_doc("bank", "send")
    with pytest.raises(api.APIError, match="has no API 'fly'"):
        apis.api_docs.show_api_doc("shop", "fly")
    with pytest.raises(api.APIError, match="positive integer"):
        apis.payments.send(1, -5)
    with pytest.raises(api.APIError, match="in stock"):
        apis.shop.buy(1, 10_000)
    before = api.state(conn)
    apis.notes.create("x", "y")
    assert api.state(conn) != before
    assert api.completion(conn) == (False, None)
    apis.supervisor.complete_task(answer=3)
    assert api.completion(conn) == (True, "3")


def test_worlds_are_seeded():
    a, b = api.create(":memory:"), api.create(":memory:")
    apps_tasks.build_world(a, 11)
    apps_tasks.build_world(b, 11)
    assert api.state(a) == api.state(b)
    c = api.create(":memory:")
    apps_tasks.build_world(c, 12)
    assert api.state(a) != api.state(c)
    rng = random.Random(0)
    assert len(apps_tasks.scenario_params(apps_tasks.TEMPLATES["move_contact"], 11,
                                          rng.randrange(1 << 30))) == 3


@pytest.mark.parametrize("attack, message", [
    ("while True:\n    pass", "time limit exceeded"),
    ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    ("import os\nos.system('echo hacked')", "PermissionError"),
    ("print(open('/etc/passwd').read())", "PermissionError"),
    ("import socket\nsocket.socket().connect(('127.0.0.1', 80))", "PermissionError"),
    ("import shutil\nshutil.rmtree('/tmp')", "PermissionError"),
])
def test_hostile_cells_error_and_the_env_keeps_serving(attack, message, tmp_path):
    env = Apps(max_steps=3, cpu_s=1.0, wall_s=3.0)
    try:
        task = _task("save_phone")
        env.reset(task)
        r = env.step(attack)
        assert not r.done and message in r.observation, r.observation
        assert env.step(env.expert_action()).won  # the same episode goes on
    finally:
        env.close()
