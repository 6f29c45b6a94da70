"""Countdown-Stepwise (ReuseRL app. E): reach the target by combining pool numbers one op at a time.

Puzzles come from `reasoning_gym`'s countdown generator (3–4 numbers, targets 10–999, ReuseRL
app. E). Each action is one arithmetic operation on two numbers of the current pool, which replaces
them by the result; `Rollback` undoes the last operation and `Reset` restores the initial pool. The
episode is won when the pool is exactly [target], which forces every number to be used.

Action syntax (the paper names the operations but prints no literal syntax; its worked example,
app. F.3, writes `op(-, 80, 28)`): canonical `80 - 28` with operators `+ - * /`; also accepted,
case- and space-insensitive: `op(-, 80, 28)`, `x`/`×` for `*`, `÷` for `/`, `−` for `-`, a
trailing `= 52` (which must then be right), a trailing period, surrounding quotes or backticks,
and `Rollback` / `Roll back` / `Reset`. Subtraction must give a positive result and division must be
exact (the usual Countdown rules; the paper states none), so pool values are always positive ints.

"Stuck" (ReuseRL app. G.2, H): an operation or an unparsable action while fewer than two numbers
remain ends the episode as a failure (`info["stuck"]`); elsewhere invalid actions cost a step and
the episode goes on. `stuck_ends=False` turns this off.

Splits: one `reasoning_gym` stream per seed, partitioned by a hash of the puzzle's content (sorted
numbers, target), so train and test can never share a puzzle, whatever the seeds and sizes.
"""

from __future__ import annotations

import functools
import itertools
import re
import zlib
from typing import Any

from skilljax.envs.base import Env, EnvError, StepResult, Task

OPERATORS = ("+", "-", "*", "/")
_TEST_BUCKETS = 4        # one puzzle in 4 (by content hash) belongs to the test split
_SEED_STRIDE = 2 ** 32   # reasoning_gym seeds item i with Random(seed + i): keep seeds apart

_ALIASES = str.maketrans({"×": "*", "x": "*", "÷": "/", "−": "-", "–": "-"})
_INFIX = re.compile(r"(\d+)\s*([-+*/])\s*(\d+)(?:\s*=\s*(\d+))?")
_PREFIX = re.compile(r"op\s*\(\s*([-+*/])\s*,\s*(\d+)\s*,\s*(\d+)\s*\)(?:\s*=\s*(\d+))?")


def apply_op(a: int, operator: str, b: int) -> int | None:
    """The result of `a operator b` under Countdown rules, or None when the rules forbid it."""
    if operator == "+":
        return a + b
    if operator == "*":
        return a * b
    if operator == "-":
        return a - b if a > b else None
    return a // b if a % b == 0 else None


def parse_action(action: str) -> tuple[str, Any]:
    """("rollback" | "reset", None), ("op", (a, operator, b, claimed or None)) or ("bad", None)."""
    text = action.strip().strip("`'\"").strip().rstrip(".").strip().lower()
    if text in ("rollback", "roll back"):
        return "rollback", None
    if text == "reset":
        return "reset", None
    text = text.translate(_ALIASES)
    if m := _INFIX.fullmatch(text):
        a, operator, b, claimed = m.groups()
    elif m := _PREFIX.fullmatch(text):
        operator, a, b, claimed = m.groups()
    else:
        return "bad", None
    return "op", (int(a), operator, int(b), None if claimed is None else int(claimed))


def _remove(pool: list[int], a: int, b: int) -> list[int] | None:
    """`pool` without one `a` and one `b` (a multiset difference), or None if they are not there."""
    rest = list(pool)
    for n in (a, b):
        if n not in rest:
            return None
        rest.remove(n)
    return rest


def _pair_ops(pool: list[int]):
    """Every allowed (a, operator, b, result) on two pool numbers, each distinct op once."""
    seen = set()
    for i, j in itertools.combinations(range(len(pool)), 2):
        hi, lo = max(pool[i], pool[j]), min(pool[i], pool[j])
        for operator in OPERATORS:
            result = apply_op(hi, operator, lo)   # larger first: the only order - and / allow
            if result is not None and (hi, operator, lo) not in seen:
                seen.add((hi, operator, lo))
                yield hi, operator, lo, result


@functools.lru_cache(maxsize=1 << 16)
def solve(pool: tuple[int, ...], target: int) -> tuple[tuple[int, str, int], ...] | None:
    """Ops (a, operator, b) that turn the multiset `pool` (sorted) into [target]; None if none do.

    Exhaustive depth-first search: with at most 4 numbers there are at most 6·4 · 3·4 · 4 ops.
    """
    if len(pool) == 1:
        return () if pool[0] == target else None
    for a, operator, b, result in _pair_ops(list(pool)):
        rest = tuple(sorted(_remove(list(pool), a, b) + [result]))
        tail = solve(rest, target)
        if tail is not None:
            return ((a, operator, b),) + tail
    return None


def _key(numbers: list[int], target: int) -> str:
    return f"{target}={'.'.join(map(str, sorted(numbers)))}"


def _split_of(numbers: list[int], target: int) -> str:
    bucket = zlib.crc32(_key(numbers, target).encode()) % _TEST_BUCKETS  # stable across processes
    return "test" if bucket == 0 else "train"


def _fmt(op: dict[str, Any]) -> str:
    return f"{op['a']} {op['operator']} {op['b']} = {op['result']}"


class Countdown(Env):
    name = "countdown"
    max_steps = 30   # ReuseRL app. E: T = 30

    def __init__(self, max_steps: int = 30, stuck_ends: bool = True):
        self.max_steps = max_steps
        self.stuck_ends = stuck_ends
        self._task: Task | None = None

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return ("countdown_3", "countdown_4")

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, min_numbers: int = 3,
                   max_numbers: int = 4, min_target: int = 10, max_target: int = 999) -> list[Task]:
        """The first `num` distinct solvable puzzles of this split in seed `seed`'s stream.

        Defaults follow ReuseRL app. E (3–4 numbers, targets in [10, 999]). Lists for a smaller
        `num` are prefixes of larger ones.
        """
        if split not in ("train", "test"):
            raise ValueError(f"countdown splits are 'train' and 'test', not {split!r}")
        if seed < 0:  # random.Random(-s) == Random(s): negative seeds would repeat positive ones
            raise ValueError(f"countdown seeds must be >= 0, got {seed}")
        import reasoning_gym  # imported here: only workers and task builders need it

        data = reasoning_gym.create_dataset(
            "countdown", size=_SEED_STRIDE, seed=seed * _SEED_STRIDE, min_numbers=min_numbers,
            max_numbers=max_numbers, min_target=min_target, max_target=max_target)
        tasks, seen = [], set()
        for index in itertools.count():
            if len(tasks) == num:
                return tasks
            meta = data[index]["metadata"]   # generated lazily, about 5 ms each
            numbers, target = [int(n) for n in meta["numbers"]], int(meta["target"])
            key = _key(numbers, target)
            if key in seen or _split_of(numbers, target) != split:
                continue
            # The generator may pass through non-positive intermediates that our rules forbid.
            if solve(tuple(sorted(numbers)), target) is None:
                continue
            seen.add(key)
            tasks.append(Task(id=key, type=f"countdown_{len(numbers)}", split=split,
                              payload={"numbers": numbers, "target": target}))
        return tasks  # not reached: the stream is endless

    # ------------------------------------------------------------------------------ the game

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        del seed  # the game is deterministic
        self._task = task
        self.target = int(task.payload["target"])
        self.initial = [int(n) for n in task.payload["numbers"]]
        self.pool = list(self.initial)
        self.history: list[tuple[list[int], dict[str, Any]]] = []   # (pool before, op) per op
        self.steps = 0
        self.done = False
        info = self._info(self.pool, None, valid=True)
        info["goal"] = (f"combine the numbers {', '.join(map(str, self.initial))} with + - * / "
                        f"into exactly {self.target}, one operation per step.")
        return self._observation(""), info

    def step(self, action: str) -> StepResult:
        if self._task is None or self.done:
            raise EnvError("Countdown.step called with no live episode; call reset(task) first.")
        self.steps += 1
        before = list(self.pool)
        kind, args = parse_action(action)
        op, error = None, None
        if kind == "rollback":
            if self.history:
                self.pool, undone = self.history.pop()
                op = {"kind": "rollback", "undone": undone}
            else:
                error = "nothing to roll back"
        elif kind == "reset":
            self.pool, self.history = list(self.initial), []
            op = {"kind": "reset"}
        elif kind == "op":
            a, operator, b, claimed = args
            rest = _remove(self.pool, a, b)
            result = apply_op(a, operator, b)
            if rest is None:
                error = "numbers not in the pool"
            elif result is None:
                error = "result not a positive integer"
            elif claimed is not None and claimed != result:
                error = "wrong result"
            else:
                op = {"kind": "op", "a": a, "operator": operator, "b": b, "result": result}
                self.history.append((before, op))
                self.pool = rest + [result]   # the result goes last so the other numbers keep place
        else:
            error = "unparsable action"

        # ReuseRL app. G.2: an op or unparsable action with < 2 numbers left is unrecoverable.
        stuck = self.stuck_ends and kind in ("op", "bad") and len(before) < 2
        won = self.pool == [self.target]
        truncated = not (won or stuck) and self.steps >= self.max_steps
        self.done = won or stuck or truncated
        if op is None:
            event = self.invalid_observation
        elif op["kind"] == "op":
            event = _fmt(op) + "."
        elif op["kind"] == "rollback":
            event = f"Rolled back {_fmt(op['undone'])}."
        else:
            event = "Reset."
        info = self._info(before, op, valid=op is not None, error=error, stuck=stuck)
        return StepResult(self._observation(event), self.success_reward if won else 0.0,
                          self.done, won=won, truncated=truncated, info=info)

    def _observation(self, event: str) -> str:
        state = f"Target: {self.target}. Numbers: {', '.join(map(str, self.pool))}."
        return f"{event} {state}" if event else state

    def _info(self, before: list[int], op: dict[str, Any] | None, valid: bool,
              error: str | None = None, stuck: bool = False) -> dict[str, Any]:
        return {"valid": valid, "error": error, "op": op, "target": self.target,
                "pool_before": before, "pool": list(self.pool), "initial_pool": list(self.initial),
                "steps": self.steps, "stuck": stuck,
                "admissible_actions": self.admissible_actions()}

    def admissible_actions(self) -> list[str]:
        if self.done:
            return []
        actions = [f"{a} {operator} {b}" for a, operator, b, _ in _pair_ops(self.pool)]
        return actions + (["Rollback"] if self.history else []) + ["Reset"]

    def expert_action(self) -> str:
        """The first op of a solution from here; else step back to the nearest solvable pool."""
        plan = solve(tuple(sorted(self.pool)), self.target)
        if plan:
            a, operator, b = plan[0]
            return f"{a} {operator} {b}"
        # One Rollback then ≤ 2 ops beats Reset then 3; any longer way back, Reset is shortest.
        if self.history and solve(tuple(sorted(self.history[-1][0])), self.target) is not None:
            return "Rollback"
        return "Reset"
