"""`apps`: an offline AppWorld-style environment. The agent acts by writing Python cells that call
app APIs (`apis.contacts.search("Elena")`); a cell runs in the episode's sandbox
(`envs/apps/sandbox.py`) over the episode's own SQLite database; the task ends when the code calls
`apis.supervisor.complete_task(answer=...)` or the step limit is reached, and succeeds when the
database and the answer are what the template's reference solution gives (`envs/apps/tasks.py`).

    python -m skilljax.envs.play --env apps --policy expert --episodes 150   # 50 scenarios

Tasks come in scenarios of three (one template, one world, three parameter sets), consecutive in
`make_tasks`' list; `play` reports `scenario_success_rate` (SGC: every task of a scenario solved)
next to `success_rate` (TGC). Train and test scenarios are drawn from disjoint world seeds.

SAGE's chains: a task whose payload carries `library_code` (the functions an earlier task of its
chain wrote, `skills/library.py`) starts with that code defined in its namespace and listed in its
first observation; the expert then calls its function instead of writing it again.

An action is the code itself (the rollout's `CodeAction` takes it out of the response). A cell that
does not parse costs a step with `valid=False`; a cell that raises is valid and shows the error as
a REPL would. There are no admissible actions; `info["sample_actions"]` holds a few random single
API calls for `play --policy random`.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import random
import re
import shutil
import textwrap
import sqlite3
import tempfile
from typing import Any

from skilljax.envs.apps import api, tasks as apps_tasks
from skilljax.envs.apps.sandbox import Limits, Sandbox
from skilljax.envs.base import Env, EnvError, StepResult, Task
from skilljax.skills.library import extract_functions

INTRO = ("Apps: contacts, calendar, notes, shop, payments, called as apis.APP.API(...). "
         "print(apis.api_docs.show_api_descriptions(APP)) lists an app's APIs. "
         "Finish with apis.supervisor.complete_task(answer=None).")


_CJK = re.compile(r"[\u4e00-\u9fff]")


@dataclasses.dataclass(frozen=True)
class CodeAction:
    """A response's code cell: the text inside one `<code> </code>` block, kept as written (case,
    indentation and newlines matter in Python; the common indentation is removed). Invalid: the
    tags missing or repeated (action "" then: a response with no code), an empty block, CJK text,
    or undecodable bytes. Text outside the block (reasoning) is allowed and ignored."""
    instruction: str = ("Reason briefly, then write one Python cell inside <code> </code>; it runs "
                        "in your session and its output is the next observation.")

    def render(self, action: str, thought: str = "") -> str:
        think = f"{thought.strip()}\n" if thought.strip() else ""
        return f"{think}<code>\n{action.strip(chr(10))}\n</code>"

    def parse(self, text: str) -> tuple[str, bool, str]:
        """(code, valid, reason)."""
        low = text.lower()
        if low.count("<code>") != 1 or low.count("</code>") != 1:
            return "", False, "code tags missing or repeated"
        start, end = low.index("<code>") + len("<code>"), low.index("</code>")
        if end < start:
            return "", False, "code tags out of order"
        code = textwrap.dedent(text[start:end].strip("\n")).strip("\n")
        if not code.strip():
            return "", False, "empty code block"
        if "\ufffd" in text:
            return code, False, "undecodable bytes"
        if _CJK.search(text):
            return code, False, "CJK characters"
        return code, True, ""


class Apps(Env):
    name = "apps"
    max_steps = 4
    invalid_observation = "No code to run."

    def __init__(self, max_steps: int = 4, cpu_s: float = 2.0, wall_s: float = 5.0,
                 memory_mb: int = 512, output_chars: int = 1000, python: str | None = None):
        self.max_steps = max_steps
        self.limits = Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb,
                             output_chars=output_chars)
        self._dir = tempfile.mkdtemp(prefix="skilljax_apps_")
        self._db = os.path.join(self._dir, "state", "apps.db")
        self._box = Sandbox(os.path.join(self._dir, "scratch"), limits=self.limits,
                            **({"python": python} if python else {}))
        self._task: Task | None = None
        self._steps = 0
        self._done = True
        self._rng = random.Random(0)

    # ------------------------------------------------------------------ tasks

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return tuple(apps_tasks.TEMPLATES)

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0,
                   scenario_size: int = apps_tasks.SCENARIO_SIZE,
                   templates: str | tuple[str, ...] = ()) -> list[Task]:
        """`num` tasks: scenarios of `scenario_size` consecutive tasks (the last one may be cut).
        `templates` ("a+b" or a tuple) keeps only those templates."""
        if split not in ("train", "test"):
            raise ValueError(f"apps has splits 'train' and 'test', not {split!r}.")
        names = tuple(templates.split("+")) if isinstance(templates, str) and templates \
            else tuple(templates) or tuple(apps_tasks.TEMPLATES)
        unknown = [n for n in names if n not in apps_tasks.TEMPLATES]
        if unknown:
            raise ValueError(f"Unknown apps templates {unknown}; known: "
                             f"{', '.join(apps_tasks.TEMPLATES)}.")
        if scenario_size < 1:
            raise ValueError(f"scenario_size must be at least 1, got {scenario_size}.")
        out: list[Task] = []
        k = 0
        while len(out) < num:
            template = names[k % len(names)]
            world = apps_tasks._seed("apps-world", split, seed, k)
            params = apps_tasks.scenario_params(
                apps_tasks.TEMPLATES[template], world,
                apps_tasks._seed("apps-params", split, seed, k), scenario_size)
            scenario = f"{split}-{seed}-{k}"
            for position, p in enumerate(params):
                out.append(Task(f"{scenario}-{position}", template, split,
                                {"template": template, "params": p, "world_seed": world,
                                 "scenario": scenario, "position": position}))
            k += 1
        return out[:num]

    # ------------------------------------------------------------------ episodes

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        try:
            template = apps_tasks.TEMPLATES[task.payload["template"]]
            params, world = task.payload["params"], int(task.payload["world_seed"])
        except KeyError as e:
            raise EnvError(f"apps task {task.id} lacks {e} in its payload (make it with "
                           "Apps.make_tasks).") from None
        self._task, self._template, self._params = task, template, params
        self._steps, self._done = 0, False
        self._rng = random.Random(seed)
        self._expected = apps_tasks.expected_outcome(template, params, world)
        state_dir = os.path.dirname(self._db)
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(self._box.scratch_dir, ignore_errors=True)
        os.makedirs(state_dir)
        os.makedirs(self._box.scratch_dir)
        conn = api.create(self._db)
        apps_tasks.build_world(conn, world)
        conn.close()
        self._box.setup = ("from skilljax.envs.apps import api as _api\n"
                           f"apis = _api.connect({self._db!r})\ndel _api\n")
        self._box.reset()
        library_code = task.payload.get("library_code", "")
        self._library = tuple(f.name for f in extract_functions(library_code))
        observation = INTRO
        if library_code:
            result = self._box.run(library_code)
            if not result.ok:
                raise EnvError(f"apps task {task.id}: its library code does not run in the "
                               f"sandbox ({result.error}); validate it with "
                               "skills.library.sandbox_validator before passing it.")
            observation += " Functions from earlier tasks, callable as they are: " + "; ".join(
                f"{f.signature}" + (f" ({f.doc})" if f.doc else "")
                for f in extract_functions(library_code)) + "."
        return observation, self._info(True)

    def _info(self, valid: bool, **extra) -> dict[str, Any]:
        info = {"valid": valid, "goal": self._template.instruction.format(**self._params),
                "sample_actions": self._samples()}
        info.update(extra)
        return info

    def _samples(self) -> list[str]:
        """A few random single API calls (for a random policy): searches, writes with random
        arguments, and endings with and without an answer."""
        facts = apps_tasks.world_facts(int(self._task.payload["world_seed"]))
        rng = self._rng
        name = rng.choice(facts["contacts"])
        product = rng.choice(facts["products"])
        cid = rng.randrange(1, apps_tasks.WORLD_CONTACTS + 1)
        return [f"print(apis.contacts.search({name.split()[0]!r}))",
                f"apis.contacts.update({cid}, city={rng.choice(apps_tasks.CITIES)!r})",
                f"apis.payments.send({cid}, {rng.randrange(5, 200)}, "
                f"{rng.choice(apps_tasks.PAY_NOTES)!r})",
                f"print(apis.shop.search({product!r}))",
                f"apis.shop.buy({rng.randrange(1, apps_tasks.WORLD_PRODUCTS + 1)}, "
                f"{rng.randrange(1, 4)})",
                f"print(apis.calendar.list_events(contact_id={cid}))",
                f"apis.notes.create({rng.choice(apps_tasks.NOTE_TITLES)!r}, "
                f"'555-{rng.randrange(1000, 10000)}')",
                "apis.supervisor.complete_task()",
                f"apis.supervisor.complete_task(answer={rng.randrange(0, 300)})"]

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise EnvError("apps: step() before reset() or after the episode ended.")
        self._steps += 1
        truncated = self._steps >= self.max_steps
        code = action.strip("\n")
        if not code.strip():
            return self._end_or_go(self.invalid_observation, False, truncated)
        try:
            ast.parse(code)
        except SyntaxError as e:
            return self._end_or_go(f"SyntaxError: {e.msg} (line {e.lineno})", False, truncated)
        result = self._box.run(code)
        observation = result.output.strip() or "(no output)"
        completed, answer = self._completion()
        if completed:
            self._done = True
            final = self._final_state()
            expected_state, expected_answer = self._expected
            wrong = apps_tasks.diff(final, expected_state)
            answer_ok = apps_tasks.answers_match(answer, expected_answer)
            won = not wrong and answer_ok
            return StepResult(observation, self.success_reward if won else 0.0, True, won=won,
                              info=self._info(True, tables_wrong=wrong, answer_ok=answer_ok,
                                              cell_ok=result.ok))
        return self._end_or_go(observation, True, truncated, cell_ok=result.ok)

    def _end_or_go(self, observation: str, valid: bool, truncated: bool, **extra) -> StepResult:
        if truncated:
            self._done = True
        return StepResult(observation, 0.0, truncated, truncated=truncated,
                          info=self._info(valid, **extra))

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self._db}?mode=ro", uri=True)

    def _completion(self) -> tuple[bool, str | None]:
        conn = self._connect()
        try:
            return api.completion(conn)
        finally:
            conn.close()

    def _final_state(self) -> dict:
        conn = self._connect()
        try:
            return api.state(conn)
        finally:
            conn.close()

    def expert_action(self) -> str:
        return self._template.expert_code(self._params, self._library)

    def close(self) -> None:
        self._box.close()
        shutil.rmtree(self._dir, ignore_errors=True)
