"""The environment protocol, tasks, and the registry.

An environment is a text game played one action string at a time. It runs inside an env worker
process (`envs/pool.py`), possibly under another Python interpreter, so this module and every env
module must import without JAX, and everything that crosses the process boundary (`Task.payload`,
`info` dicts) must be JSON-serialisable.

Each env class provides:
- `make_tasks(split, num, seed, **options) -> list[Task]` (classmethod): a deterministic task list;
- `reset(task, seed) -> (observation, info)` and `step(action) -> StepResult`;
- `admissible_actions()`: the valid commands in the current state (None when the game has none);
- `expert_action()`: the expert policy's next action from the current state.

`reset`'s info carries "goal" (the task instruction, one line, shown in every prompt) and, where
the game has them, "admissible_actions"; every info carries "valid" (False: the action did not
apply).

Episodes end on success (reward `success_reward`, `won=True`), on a terminal failure the game
defines, or when `max_steps` actions have been taken (`truncated`). Invalid actions never end an
episode; they cost a step and return the game's "Nothing happens."-style observation with
`info["valid"] = False`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import importlib
import os
import shutil
import tempfile
from typing import Any, ClassVar

SUCCESS_REWARD = 10.0  # ReuseRL app. E / SKILL0: reward 10 on success, 0 otherwise


@dataclasses.dataclass(frozen=True)
class Task:
    id: str                  # unique within (env, split), stable across runs
    type: str                # task type: per-type metrics and the skill mapping key
    split: str               # "train" | "test" (env-specific extra splits allowed)
    payload: dict[str, Any]  # env-specific, JSON-serialisable

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        return cls(**d)


@dataclasses.dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    won: bool = False
    truncated: bool = False   # ended by the step limit
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepResult:
        return cls(**d)


class EnvError(RuntimeError):
    """An environment failed (bad task, crashed game, missing dependency); says what to do."""


class Env:
    """Base class; subclasses set `name`, `max_steps` and implement the methods below."""

    name: ClassVar[str] = ""
    max_steps: int = 30
    success_reward: float = SUCCESS_REWARD
    invalid_observation: ClassVar[str] = "Nothing happens."

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, **options) -> list[Task]:
        raise NotImplementedError

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        raise NotImplementedError

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        raise NotImplementedError

    def admissible_actions(self) -> list[str] | None:
        return None

    def expert_action(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass

    @classmethod
    def before_step(cls, pairs: list[tuple["Env", str]]) -> None:
        """Optional: called in a worker with its (env, action) items of one batched `step`
        before they are stepped one by one (Search-QA runs their searches as one batch)."""

    @classmethod
    def start_sidecars(cls, env_kwargs: dict[str, Any],
                       log_dir: str | None) -> tuple[list[Any], dict[str, Any]]:
        """Optional: processes the workers depend on, started by the host before the pool (a
        retrieval service), and the env kwargs that point at them. A sidecar has `ensure()` (None,
        or why it had to be restarted) and `close()`; the pool checks it before every reset."""
        return [], env_kwargs


# name → "module:Class", imported lazily so a worker imports only the env it runs.
_REGISTRY: dict[str, str] = {
    "alfworld": "skilljax.envs.alfworld:AlfWorld",
    "apps": "skilljax.envs.apps.env:Apps",
    "appworld": "skilljax.envs.apps.appworld_env:AppWorldEnv",
    "chores": "skilljax.envs.chores:Chores",
    "countdown": "skilljax.envs.countdown:Countdown",
    "search_qa": "skilljax.envs.search_qa:SearchQA",
    "textworld_cooking": "skilljax.envs.textworld_cooking:TextWorldCooking",
}


def register(name: str, target: str) -> None:
    """Adds an env as "package.module:Class" (the module must be importable by env workers)."""
    _REGISTRY[name] = target


def names() -> list[str]:
    return sorted(_REGISTRY)


def env_target(name: str) -> str:
    """"module:Class" for a registered name; a "module:Class" string passes through."""
    if ":" in name:
        return name
    if name not in _REGISTRY:
        raise ValueError(f"Unknown environment {name!r}; registered: {', '.join(names())} "
                       "(or pass \"package.module:Class\").")
    return _REGISTRY[name]


def env_class(name: str) -> type[Env]:
    module, cls = env_target(name).split(":")
    return getattr(importlib.import_module(module), cls)


def make(name: str, **kwargs) -> Env:
    return env_class(name)(**kwargs)


def build_once(game_file: str, build) -> bool:
    """Make sure `game_file` exists, building its directory with `build(tmp_dir)` if it does not;
    True when this call built it. Safe across processes: one exclusive `flock` per directory (the
    kernel releases it if the holder dies), the build happens in a private temporary directory
    renamed into place, so the game appears whole or not at all; a crashed builder's leftovers are
    removed by the next one."""
    if os.path.exists(game_file):
        return False
    game_dir = os.path.dirname(game_file)
    parent, name = os.path.split(game_dir)
    os.makedirs(parent, exist_ok=True)
    with open(os.path.join(parent, f".lock-{name}"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.exists(game_file):  # someone built it while we waited
                return False
            for stale in glob.glob(os.path.join(parent, f".tmp-{name}-*")):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent)
            try:
                build(tmp)
                os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the game from other users
                os.rename(tmp, game_dir)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
