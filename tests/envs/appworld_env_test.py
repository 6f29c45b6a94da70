"""The AppWorld adapter. AppWorld itself cannot be installed here (its data downloads at install
time), so these tests stand a small `appworld` module in for it, with the surface the adapter
uses (`AppWorld(task_id=, experiment_name=)`, `.task.instruction`, `.execute`, `.task_completed`,
`.evaluate().success`, `.close`); what they check is the adapter's own logic: dataset files,
scenario ids, library code, completion and evaluation, and its errors."""

import sys
import types

import pytest

from skilljax.envs import base
from skilljax.envs.apps.appworld_env import AppWorldEnv
from skilljax.envs.base import EnvError


class _World:
    def __init__(self, task_id, experiment_name, **kw):
        self.task = types.SimpleNamespace(
            instruction=f"Do task {task_id}.",
            supervisor={"first_name": "Ada", "last_name": "Lee", "email": "ada@x.test",
                        "phone_number": "555-0101"})
        self.ns, self.done, self.closed = {"answer": None}, False, False

        def complete_task(answer=None):
            self.ns["answer"], self.done = answer, True
        self.ns["apis"] = types.SimpleNamespace(
            supervisor=types.SimpleNamespace(complete_task=complete_task))

    def execute(self, code):
        try:
            exec(code, self.ns)
        except Exception as e:  # AppWorld's way of reporting a failed cell
            return f"Execution failed. Traceback:\n{type(e).__name__}: {e}"
        return "Execution successful."

    def task_completed(self):
        return self.done

    def evaluate(self):
        return types.SimpleNamespace(success=self.ns["answer"] == 42)

    def close(self):
        self.closed = True


@pytest.fixture
def fake_appworld(monkeypatch, tmp_path):
    module = types.ModuleType("appworld")
    module.AppWorld = _World
    monkeypatch.setitem(sys.modules, "appworld", module)
    (tmp_path / "data" / "datasets").mkdir(parents=True)
    (tmp_path / "data" / "datasets" / "train.txt").write_text("82e2fac_1\n82e2fac_2\n82e2fac_3\n"
                                                              "aa01b2c_1\n")
    monkeypatch.setenv("APPWORLD_ROOT", str(tmp_path))
    return module


def test_tasks_from_the_dataset_file_in_scenarios(fake_appworld):
    assert base.env_class("appworld") is AppWorldEnv
    tasks = AppWorldEnv.make_tasks("train", 10)
    assert [t.id for t in tasks] == ["82e2fac_1", "82e2fac_2", "82e2fac_3", "aa01b2c_1"]
    assert [(t.payload["scenario"], t.payload["position"]) for t in tasks[:3]] == \
        [("82e2fac", 0), ("82e2fac", 1), ("82e2fac", 2)]
    with pytest.raises(EnvError, match="appworld download data"):
        AppWorldEnv.make_tasks("test", 3)  # no test_normal.txt


def test_episode_library_and_evaluation(fake_appworld):
    env = AppWorldEnv(max_steps=3)
    task = AppWorldEnv.make_tasks("train", 2)[1]
    library = "def answer_of():\n    \"\"\"The answer.\"\"\"\n    return 42\n"
    task = base.Task(task.id, task.type, task.split, dict(task.payload, library_code=library))
    obs, info = env.reset(task)
    assert info["goal"] == "Do task 82e2fac_2." and "Ada Lee" in obs
    assert "answer_of() (The answer.)" in obs
    r = env.step("x = 1 / 0")
    assert not r.done and "ZeroDivisionError" in r.observation
    r = env.step("apis.supervisor.complete_task(answer=answer_of())")
    assert r.done and r.won and r.reward == env.success_reward
    env.reset(task)
    assert not env.step("apis.supervisor.complete_task(answer=7)").won
    with pytest.raises(EnvError, match="no expert"):
        env.expert_action()
    bad = base.Task(task.id, task.type, task.split, dict(task.payload, library_code="1/0"))
    with pytest.raises(EnvError, match="library code failed"):
        env.reset(bad)
    env.close()


def test_clear_errors_without_appworld_or_its_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "appworld", None)  # import fails
    with pytest.raises(EnvError, match="env.python"):
        AppWorldEnv()
    monkeypatch.delenv("APPWORLD_ROOT", raising=False)
    with pytest.raises(EnvError, match="APPWORLD_ROOT is not set"):
        AppWorldEnv.make_tasks("train", 3)
