"""`appworld`: the real AppWorld benchmark behind the env protocol, for users who have it installed.

AppWorld (Trivedi et al., 2024) cannot be installed here: its tasks and databases download at
install time and its pins (pydantic 1, ...) conflict with the JAX stack. So it runs in its own
interpreter, as the env pool's workers:

    python -m venv ~/appworld-env && ~/appworld-env/bin/pip install appworld
    ~/appworld-env/bin/appworld install && ~/appworld-env/bin/appworld download data
    export APPWORLD_ROOT=/path/with/data   # where `appworld download data` put data/
    python -m skilljax.train --config configs/sage_appworld.py --workdir DIR \
        --config.env.python=$HOME/appworld-env/bin/python

The trainer's process never imports `appworld`: task ids come from the dataset files
(`$APPWORLD_ROOT/data/datasets/<dataset>.txt`), and only the workers, under `env.python`, open
`AppWorld(task_id=...)` worlds. A task id `82e2fac_1` is task 1 of scenario `82e2fac` (AppWorld's
three tasks of one scenario share a template), so SAGE's chains (`rl/chains.py`) work as on the
offline `apps` env: `library_code` in a task's payload is executed first and listed in the first
observation. Success is AppWorld's own state-based evaluation (`world.evaluate()`) once the code
calls `apis.supervisor.complete_task(...)`. There is no expert policy: warm-start from your own
trajectories (AppWorld's ground-truth solutions are not read).
"""

from __future__ import annotations

import os
from typing import Any

from skilljax.envs.base import Env, EnvError, StepResult, Task
from skilljax.skills.library import extract_functions

DATASETS = {"train": "train", "test": "test_normal", "dev": "dev", "test_normal": "test_normal",
            "test_challenge": "test_challenge"}


def _root() -> str:
    root = os.environ.get("APPWORLD_ROOT", "")
    if not root:
        raise EnvError("APPWORLD_ROOT is not set: point it at the directory where `appworld "
                       "download data` wrote data/ (see skilljax/envs/apps/appworld_env.py).")
    return root


def task_ids(dataset: str) -> list[str]:
    """The task ids of an AppWorld dataset, read from its file (no `appworld` import)."""
    path = os.path.join(_root(), "data", "datasets", f"{dataset}.txt")
    if not os.path.isfile(path):
        raise EnvError(f"No AppWorld dataset file {path}; run `appworld download data` with "
                       "APPWORLD_ROOT set, or fix APPWORLD_ROOT.")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


class AppWorldEnv(Env):
    name = "appworld"
    max_steps = 30
    invalid_observation = "No code to run."

    def __init__(self, max_steps: int = 30, experiment_name: str = "skilljax",
                 remote_environment_url: str = ""):
        try:
            import appworld
        except ImportError:
            raise EnvError("The appworld env needs the `appworld` package in the env workers' "
                           "interpreter: install it in its own environment and set "
                           "env.python to that interpreter (skilljax/envs/apps/appworld_env.py).")
        self._appworld = appworld
        self.max_steps = max_steps
        self.experiment_name = experiment_name
        self.remote_environment_url = remote_environment_url
        self._world = None
        self._steps = 0
        self._goal = ""

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return ()  # task types are scenario ids, known from the data

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, dataset: str = "") -> list[Task]:
        """The first `num` tasks of the split's dataset (train → train, test → test_normal, or
        `dataset`), in scenario order; `seed` is unused (the datasets are fixed)."""
        name = dataset or DATASETS.get(split)
        if name is None:
            raise ValueError(f"appworld splits: {sorted(DATASETS)}, not {split!r}.")
        out = []
        for tid in task_ids(name)[:num]:
            scenario, _, number = tid.rpartition("_")
            if not scenario or not number.isdigit():
                raise EnvError(f"AppWorld task id {tid!r} is not SCENARIO_N.")
            out.append(Task(tid, scenario, split, {"task_id": tid, "scenario": scenario,
                                                   "position": int(number) - 1}))
        return out

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        self.close()
        kwargs = {"task_id": task.payload["task_id"], "experiment_name": self.experiment_name}
        if self.remote_environment_url:
            kwargs["remote_environment_url"] = self.remote_environment_url
        self._world = self._appworld.AppWorld(**kwargs)
        self._steps = 0
        t = self._world.task
        self._goal = t.instruction
        sup = getattr(t, "supervisor", None)
        who = ""
        if sup is not None:
            get = (lambda k: sup.get(k, "")) if isinstance(sup, dict) else \
                (lambda k: getattr(sup, k, ""))
            who = (f" You act for {get('first_name')} {get('last_name')} ({get('email')}, "
                   f"{get('phone_number')}).")
        observation = ("Write Python against apis.APP.API(...); "
                       "apis.api_docs.show_api_descriptions(app_name=...) lists an app's APIs. "
                       "Finish with apis.supervisor.complete_task(answer=...)." + who)
        library = task.payload.get("library_code", "")
        if library:
            out = self._world.execute(library)
            if "Execution failed" in out or "Traceback" in out:
                raise EnvError(f"AppWorld task {task.id}: its library code failed:\n{out}")
            observation += " Functions from earlier tasks, callable as they are: " + "; ".join(
                f.signature + (f" ({f.doc})" if f.doc else "")
                for f in extract_functions(library)) + "."
        return observation, {"valid": True, "goal": self._goal}

    def step(self, action: str) -> StepResult:
        if self._world is None:
            raise EnvError("appworld: step() before reset().")
        self._steps += 1
        truncated = self._steps >= self.max_steps
        if not action.strip():
            return StepResult(self.invalid_observation, 0.0, truncated, truncated=truncated,
                              info={"valid": False, "goal": self._goal})
        output = self._world.execute(action)
        if self._world.task_completed():
            result = self._world.evaluate()
            won = bool(result.success if hasattr(result, "success")
                       else result.to_dict()["success"])
            self.close()
            return StepResult(output, self.success_reward if won else 0.0, True, won=won,
                              info={"valid": True, "goal": self._goal})
        if truncated:
            self.close()
        return StepResult(output, 0.0, truncated, truncated=truncated,
                          info={"valid": True, "goal": self._goal})

    def expert_action(self) -> str:
        raise EnvError("The appworld env has no expert policy: warm-start SAGE from your own "
                       "expert trajectories (sft.steps=0 to skip the warm start).")

    def close(self) -> None:
        if self._world is not None:
            try:
                self._world.close()
            finally:
                self._world = None
