"""SAGE's skill library (paper 004): the functions an agent wrote while solving one task of a chain,
offered to the next task of the same chain.

After a task succeeds, `extract_functions` takes the top-level `def`s of its code (AST; nested
functions and methods stay with their parents). `SkillLibrary.add` re-runs each definition in a
fresh sandbox (`envs.apps.sandbox`) before it joins: a definition that fails there (a default
argument that raises, a name it needs at definition time that only the old namespace had) never
reaches the next task. A library belongs to one chain: the next task lists its functions
(`listing`: name, signature, first docstring line) in the prompt and gets them in its namespace
(`setup_code`); another chain never sees them. `used_in(code)` names the library functions a
cell calls, for the skill-integrated reward (`rewards.chain_rewards`).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterable


@dataclasses.dataclass(frozen=True)
class LibraryFunction:
    name: str
    source: str          # the `def` exactly as written (decorators included)
    signature: str       # "name(a, b=1)"
    doc: str             # first line of the docstring ("" without one)
    task: int = 0        # index in the chain of the task whose code defined it


def extract_functions(code: str, task: int = 0) -> list[LibraryFunction]:
    """Top-level function definitions of `code`, in order; a later `def` of a name replaces an
    earlier one (as running the code would). Code that does not parse defines nothing."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    found: dict[str, LibraryFunction] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        lines = code.splitlines()[start - 1:node.end_lineno]
        source = "\n".join(lines)
        doc = (ast.get_docstring(node) or "").strip().splitlines()
        found.pop(node.name, None)
        found[node.name] = LibraryFunction(node.name, source,
                                           f"{node.name}({ast.unparse(node.args)})",
                                           doc[0] if doc else "", task)
    return list(found.values())


def used_in(code: str, names: Iterable[str]) -> set[str]:
    """The names among `names` that `code` calls (`f(...)`), read from its AST."""
    wanted = set(names)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    return {n.func.id for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in wanted}


class SkillLibrary:
    """One chain's functions. `validate(source) -> error or ""` checks a definition in a fresh
    sandbox (`sandbox_validator`); None skips the check (tests of the bookkeeping alone)."""

    def __init__(self, validate: Callable[[str], str] | None = None):
        self.functions: dict[str, LibraryFunction] = {}
        self.rejected: list[tuple[str, str]] = []   # (name, why)
        self._validate = validate

    def add(self, functions: Iterable[LibraryFunction]) -> list[str]:
        """Validate and insert (a new definition of a name replaces the old one); the names
        inserted."""
        added = []
        for fn in functions:
            error = self._validate(self.setup_code(exclude=fn.name) + "\n" + fn.source) \
                if self._validate is not None else ""
            if error:
                self.rejected.append((fn.name, error))
                continue
            self.functions[fn.name] = fn
            added.append(fn.name)
        return added

    def setup_code(self, exclude: str = "") -> str:
        """Source that defines the library in a namespace (run before the next task's cells)."""
        return "\n\n".join(f.source for n, f in self.functions.items() if n != exclude)

    def listing(self) -> str:
        """The prompt block: one line per function ("" for an empty library)."""
        if not self.functions:
            return ""
        lines = ["Functions from earlier tasks, callable as they are:"]
        lines += [f"- {f.signature}" + (f": {f.doc}" if f.doc else "")
                  for f in self.functions.values()]
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.functions)


def sandbox_validator(scratch_dir, limits=None) -> Callable[[str], str]:
    """A validator that runs a definition in a fresh sandbox process: "" when it defines cleanly,
    else the sandbox's error."""
    from skilljax.envs.apps.sandbox import Limits, Sandbox

    def validate(source: str) -> str:
        with Sandbox(scratch_dir, limits=limits or Limits(cpu_s=2.0, wall_s=5.0)) as box:
            result = box.run(source)
        return "" if result.ok else (result.error or "the definition failed")
    return validate
