"""The skill bank: markdown skill files, the task-type → file mapping, and context strings.

A bank is a directory with `skill_mapping.json` and the markdown files it names (the layout of the
released SKILL0 code, `shared/reference/skill0_released_code.md` §2):

    {"skill_files":   {"general_skills": "general_skills.md", "heat": "heat.md", ...},
     "task_to_skill": {"pick_heat_then_place_in_recep": "heat", ...}}

- `skill_files` names each skill file (the curriculum's unit: it is kept or withdrawn whole) and
  gives its path relative to the JSON. The file named `general_skills` holds the general skills:
  it applies to every task type and is never listed in `task_to_skill`.
- `task_to_skill` maps a task type (the env's `Task.type`) to the name of its skill file. As an
  extension of the released schema, the value may also be a list of names.
- An optional `description` string is ignored.

A skill file is split into sections by header lines `### KEY ###`; a section's body runs to the
next header. Text before the first header is a note for human readers and never reaches a prompt.
A section keyed `TASK: <type>` is specific to that task type: it goes only into that type's
context, so one file can serve several task types without showing one type's procedure to another
(chores' `temperature.md` holds both `TASK: heat` and `TASK: cool`). A section keyed
`TASK: <file name>` is the file's own task section, as the released banks write them (`heat.md`
holds `TASK: heat` for the type `pick_heat_then_place_in_recep`): it goes to every task type of
the file that has no `TASK: <type>` section of its own there (so `pick_two_obj_and_place` reads
`TASK: pick_and_place`, as the released code's `GAMEFILE_TO_SKILL_KEY` maps it). Every other
section of a file goes to every task type mapped to the file. Section keys are unique across the
bank, because the released code merges all sections into one flat dict where a duplicate would
silently overwrite.

The context for a task type (released code §2.5, rewritten): the general file's sections, then the
sections of the task's own files, each only if its file is active, bodies joined by a blank line.
No active file, or skills switched off (`active_files=[]`), gives the empty string.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence

GENERAL = "general_skills"        # the released mapping's name for the general file (§2.4)
MAPPING_FILE = "skill_mapping.json"
TASK_PREFIX = "TASK: "
PACKAGED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "data", "skills")

_HEADER = re.compile(r"^###[ \t]+(.+?)[ \t]+###[ \t]*$", re.MULTILINE)
_MAPPING_KEYS = {"skill_files", "task_to_skill", "description"}


class SkillBankError(ValueError):
    """A skill bank that cannot be used as written; the message says where and why."""


def parse_sections(text: str, source: str = "<text>") -> dict[str, str]:
    """`### KEY ###` header lines → {key: stripped body}, in file order."""
    headers = list(_HEADER.finditer(text))
    if not headers:
        raise SkillBankError(f"{source}: no section headers; a skill file needs at least one "
                             "line of the form '### KEY ###'.")
    sections: dict[str, str] = {}
    for i, m in enumerate(headers):
        key = m.group(1).strip()
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        body = text[m.end():end].strip()
        if key in sections:
            raise SkillBankError(f"{source}: section {key!r} appears twice.")
        if not body:
            raise SkillBankError(f"{source}: section {key!r} is empty.")
        sections[key] = body
    return sections


def _names(value, task_type: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise SkillBankError(f"task_to_skill[{task_type!r}] must be a skill-file name or a "
                             f"non-empty list of names, not {value!r}.")
    return names


class SkillBank:
    """Skill files by name, their sections, and which task types use which files."""

    def __init__(self, files: Mapping[str, Mapping[str, str]],
                 task_to_skill: Mapping[str, str | Sequence[str]], directory: str | None = None):
        self.directory = directory
        where = f" in {directory}" if directory else ""
        # General first: it leads every context and takes the first budget slot (§3.3).
        order = ([GENERAL] if GENERAL in files else []) + [n for n in files if n != GENERAL]
        self._files = {n: dict(files[n]) for n in order}
        self._task_files = {t: _names(v, t) for t, v in task_to_skill.items()}
        self._validate(where)

    def _validate(self, where: str) -> None:
        if not self._task_files:
            raise SkillBankError(f"task_to_skill{where} is empty.")
        owner: dict[str, str] = {}
        for name, sections in self._files.items():
            if not sections:
                raise SkillBankError(f"Skill file {name!r}{where} has no sections.")
            for key in sections:
                if key in owner:
                    raise SkillBankError(f"Section {key!r} is in both {owner[key]!r} and "
                                         f"{name!r}{where}; section keys must be unique in a bank.")
                owner[key] = name
        for ttype, names in self._task_files.items():
            for name in names:
                if name == GENERAL:
                    raise SkillBankError(f"task_to_skill[{ttype!r}]{where} names {GENERAL!r}; it "
                                         "applies to every task type and must not be mapped.")
                if name not in self._files:
                    raise SkillBankError(f"task_to_skill[{ttype!r}]{where} names {name!r}, which "
                                         f"is not in skill_files {sorted(self._files)}.")
        for name in self._files:
            if name != GENERAL and not self.task_types_of(name):
                raise SkillBankError(f"Skill file {name!r}{where} is used by no task type, so "
                                     "the curriculum could never score it; map it or remove it.")
        for key, name in owner.items():
            if key.startswith(TASK_PREFIX):
                ttype = key[len(TASK_PREFIX):].strip()
                if name not in self._task_files.get(ttype, ()) and ttype != name:
                    raise SkillBankError(
                        f"Section {key!r} of {name!r}{where} names neither a task type that uses "
                        f"{name!r} (task types of {name!r}: {list(self.task_types_of(name))}) nor "
                        f"the file itself ('{TASK_PREFIX}{name}').")

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, directory: str | os.PathLike) -> SkillBank:
        directory = os.path.abspath(directory)
        path = os.path.join(directory, MAPPING_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No {MAPPING_FILE} in {directory}; a skill bank directory "
                                    "needs one (see skilljax/skills/bank.py).")
        with open(path, encoding="utf-8") as f:
            try:
                mapping = json.load(f)
            except json.JSONDecodeError as e:
                raise SkillBankError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(mapping, dict) or not {"skill_files", "task_to_skill"} <= set(mapping):
            raise SkillBankError(f"{path} must be an object with 'skill_files' and "
                                 "'task_to_skill'.")
        if unknown := set(mapping) - _MAPPING_KEYS:
            raise SkillBankError(f"{path}: unknown keys {sorted(unknown)}; allowed: "
                                 f"{sorted(_MAPPING_KEYS)}.")
        files = {}
        for name, rel in mapping["skill_files"].items():
            file_path = os.path.join(directory, rel)
            if not os.path.isfile(file_path):
                raise FileNotFoundError(f"Skill file {name!r} → {rel!r} named in {path} does "
                                        f"not exist ({file_path}).")
            with open(file_path, encoding="utf-8") as f:
                files[name] = parse_sections(f.read(), source=file_path)
        return cls(files, mapping["task_to_skill"], directory=directory)

    @classmethod
    def for_env(cls, env_name: str) -> SkillBank:
        """The project's own bank for an env, packaged under `skilljax/data/skills/<env>/`."""
        if env_name not in cls.packaged_envs():
            raise FileNotFoundError(f"No packaged skill bank for env {env_name!r}; packaged: "
                                    f"{cls.packaged_envs()} (in {PACKAGED_DIR}).")
        return cls.load(os.path.join(PACKAGED_DIR, env_name))

    @staticmethod
    def packaged_envs() -> list[str]:
        if not os.path.isdir(PACKAGED_DIR):
            return []
        return sorted(d for d in os.listdir(PACKAGED_DIR)
                      if os.path.isfile(os.path.join(PACKAGED_DIR, d, MAPPING_FILE)))

    # ------------------------------------------------------------------ queries

    @property
    def file_names(self) -> tuple[str, ...]:
        """Every skill file, `general_skills` first, then in mapping order."""
        return tuple(self._files)

    @property
    def task_types(self) -> tuple[str, ...]:
        return tuple(self._task_files)

    def __len__(self) -> int:
        return len(self._files)   # N of paper eq. 6

    def sections(self, name: str) -> dict[str, str]:
        self._check_file(name)
        return dict(self._files[name])

    def files_for(self, task_type: str) -> tuple[str, ...]:
        """The files whose sections can reach this task type's context, general first."""
        if task_type not in self._task_files:
            raise SkillBankError(
                f"Task type {task_type!r} has no skill mapping"
                f"{' in ' + self.directory if self.directory else ''}; mapped types: "
                f"{list(self._task_files)}.")
        general = (GENERAL,) if GENERAL in self._files else ()
        return general + self._task_files[task_type]

    def task_types_of(self, name: str) -> tuple[str, ...]:
        """The task types whose context the file feeds: all of them for `general_skills`."""
        self._check_file(name)
        return tuple(t for t, names in self._task_files.items()
                     if name == GENERAL or name in names)

    def context(self, task_type: str, active_files: Iterable[str] | None = None) -> str:
        """The skill text for one task type given the active files (None: every file)."""
        files = self.files_for(task_type)
        if active_files is not None:
            active = set(active_files)
            for name in active:
                self._check_file(name)
            files = tuple(f for f in files if f in active)
        parts = []
        for name in files:
            sections = self._files[name]
            targets = {k: k[len(TASK_PREFIX):].strip() for k in sections
                       if k.startswith(TASK_PREFIX)}
            # The type's own section, else the file's own (released) task section.
            wanted = task_type if task_type in targets.values() else name
            for key, body in sections.items():
                if key in targets and targets[key] != wanted:
                    continue   # another task type's section of a shared file
                parts.append(body)
        return "\n\n".join(parts)

    def contexts(self, active_files: Iterable[str] | None = None) -> dict[str, str]:
        """{task type: context}: what `rl.rollout` accepts as `skill_context`."""
        active = None if active_files is None else list(active_files)
        return {t: self.context(t, active) for t in self._task_files}

    def _check_file(self, name: str) -> None:
        if name not in self._files:
            raise SkillBankError(f"Unknown skill file {name!r}; this bank has "
                                 f"{list(self._files)}.")
