"""Skill projection φ (ReuseRL §3.1, §4.2, app. F): each env action → one atomic skill symbol.

Deterministic rules over the action's verb (and, for Countdown, its operands relative to the
target). The paper fixes the alphabet sizes — ALFWorld 5, TextWorld-Cooking 10, Countdown-Stepwise
26 — and gives one worked example each (app. F); the class tables themselves did not survive in
our copy, so the classes below are ours, chosen to reproduce those examples and sizes:

- ALFWorld (5): `explore` (go to, look, examine, inventory), `open` (open, close), `take`,
  `process` (heat, cool, clean, slice, use), `put` (put, move … to). `chores` uses the same
  alphabet (it has no containers, so `open` never occurs).
- TextWorld-Cooking (10): `navigate` (go), `observe` (look, inventory, examine anything but the
  cookbook), `read` (examine / read the cookbook), `open` (open, close), `take`, `drop` (drop,
  put, insert), `cut` (slice, dice, chop), `cook`, `prepare`, `eat`.
- Countdown-Stepwise (26): an operation's operator with the unordered pair of its operands' roles,
  `op(role, role)`, 4 operators × 6 role pairs, plus `rollback` and `reset`. Roles relative to the
  target t (app. F.3, t = 54: "n > 59.4 is large, |n − 54| ≤ 5.4 is near_target"): large if
  n > 1.1·t, near_target if |n − t| ≤ 0.1·t, small otherwise.

An action no rule covers (malformed output, an unknown verb) projects to `OTHER`, which the
dictionary never merges: it still costs one segment, so a successful episode's sequence has one
symbol per env step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from skilljax.envs.base import Task
from skilljax.skills.segmentation import OTHER

ROLES = ("large", "near_target", "small")
OPERATORS = ("+", "-", "*", "/")

ALPHABETS: dict[str, tuple[str, ...]] = {
    "alfworld": ("explore", "open", "take", "process", "put"),
    "textworld_cooking": ("navigate", "observe", "read", "open", "take", "drop", "cut", "cook",
                          "prepare", "eat"),
    "countdown": tuple(f"{o}({a},{b})" for o in OPERATORS for i, a in enumerate(ROLES)
                       for b in ROLES[i:]) + ("rollback", "reset"),
}
ALPHABETS["chores"] = ALPHABETS["alfworld"]

_ALFWORLD = {"go": "explore", "look": "explore", "examine": "explore", "inventory": "explore",
             "open": "open", "close": "open", "take": "take", "heat": "process",
             "cool": "process", "clean": "process", "slice": "process", "use": "process",
             "put": "put", "move": "put"}
_COOKING = {"go": "navigate", "look": "observe", "inventory": "observe", "open": "open",
            "close": "open", "take": "take", "drop": "drop", "put": "drop", "insert": "drop",
            "slice": "cut", "dice": "cut", "chop": "cut", "cook": "cook", "prepare": "prepare",
            "eat": "eat"}


def _verb(action: str) -> tuple[str, str]:
    words = action.strip().lower().split()
    return (words[0], " ".join(words[1:])) if words else ("", "")


def project_alfworld(action: str, task: Task | None = None) -> str:
    del task
    return _ALFWORLD.get(_verb(action)[0], OTHER)


def project_textworld_cooking(action: str, task: Task | None = None) -> str:
    del task
    verb, rest = _verb(action)
    if verb in ("examine", "read"):
        return "read" if "cookbook" in rest else "observe"
    return _COOKING.get(verb, OTHER)


def role(n: int, target: int) -> str:
    """An operand's role relative to the target (app. F.3)."""
    if abs(n - target) <= 0.1 * target:
        return "near_target"
    return "large" if n > 1.1 * target else "small"


def project_countdown(action: str, task: Task | None = None) -> str:
    from skilljax.envs.countdown import parse_action  # the env's own parser: same actions parse
    if task is None:
        raise ValueError("Countdown's projection needs the task (roles are relative to its "
                         "target).")
    kind, args = parse_action(action)
    if kind in ("rollback", "reset"):
        return kind
    if kind != "op":
        return OTHER
    a, operator, b, _ = args
    target = int(task.payload["target"])
    ra, rb = sorted((role(a, target), role(b, target)), key=ROLES.index)
    return f"{operator}({ra},{rb})"


PROJECTIONS: dict[str, Callable[[str, Task | None], str]] = {
    "alfworld": project_alfworld,
    "chores": project_alfworld,
    "textworld_cooking": project_textworld_cooking,
    "countdown": project_countdown,
}


def projection(env_name: str) -> Callable[[str, Task | None], str]:
    if env_name not in PROJECTIONS:
        raise ValueError(f"No skill projection for env {env_name!r}; ReuseRL's are defined for "
                         f"{sorted(PROJECTIONS)} (add one to skilljax/skills/projection.py).")
    return PROJECTIONS[env_name]


def project(env_name: str, actions: Sequence[str], task: Task | None = None) -> tuple[str, ...]:
    """φ(τ): the skill sequence of an episode's actions."""
    phi = projection(env_name)
    return tuple(phi(a, task) for a in actions)
