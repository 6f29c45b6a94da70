"""SkillForge (paper 002): skill records, the retrieved catalog, explicit skill calls, per-skill
evidence, and the evolution step (induction by three pathways, deduplication, reflexion).

The pieces, in the order a training step meets them:
- `SkillRecord`: one skill (id, call name, title, intent, principle, when_to_apply, category =
  "general" or a task type, status, provenance, statistics, revision history); `EvolvingBank`
  holds them and is written to `WORKDIR/skills/bank.json` at every evolution step.
- `Catalog`: a frozen view of the bank for one step. Per task, the top `general_k` general and top
  `specific_k` skills of the task's type by embedding similarity between the task description and
  the skill's title + when_to_apply (eq. 2); their call names and one-line triggers go into the
  prompt (appendix A.10, Fig. 10a). `Catalog.respond` reads `<skill>NAME</skill>` tags from a
  response and gives the skill's full content for the next observation (eq. 4, Fig. 10b).
- `EvolvingBank.record_outcomes`: after a rollout, every skill called in an episode takes the
  episode's outcome: EMA success p̂ (eq. 7) and uses n; `confidence` is the underperformance score
  conf(s) = (1 − p̂)(1 − 0.5^(n/h)) (eq. 8).
- `Evolver.evolve`, every I steps: trajectory abstraction, induction, deduplication, reflexion
  through a teacher (`skilljax.skills.teachers`), prompts in `skilljax.skills.teacher_prompts`.

Evidence is per episode: an episode that calls a skill several times is one use with one outcome
(the paper updates "each time skill s is invoked in an episode with outcome r"; counting every call
would weight a long failing episode that keeps calling by its length).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from skilljax.skills.retrieval import Embedder, top_k

ALPHA = 0.1        # EMA smoothing α (paper 002 §3.3, eq. 7; issue 29)
HALF_LIFE = 20.0   # usage half-life h of the underperformance score (eq. 8; issue 29)
PRIOR = 0.5        # p̂ of a skill never used: no evidence either way (not stated in the paper)
GENERAL = "general"


def ema(p: float, success: bool | float, alpha: float = ALPHA) -> float:
    """p̂ ← α·r + (1 − α)·p̂ (eq. 7)."""
    return alpha * float(success) + (1.0 - alpha) * p


def confidence(p: float, uses: int, half_life: float = HALF_LIFE) -> float:
    """conf(s) = (1 − p̂)(1 − 0.5^(n/h)) (eq. 8): high for skills used often and failing often."""
    return (1.0 - p) * (1.0 - 0.5 ** (uses / half_life))


# ---------------------------------------------------------------------------- records


@dataclasses.dataclass
class SkillStats:
    uses: int = 0                 # episodes that called the skill
    successes: int = 0            # ... and succeeded
    p_hat: float = PRIOR          # EMA success (eq. 7)
    consecutive_failures: int = 0
    last_used_step: int = -1
    calls: int = 0                # every call, repeats within an episode included

    def update(self, won: bool, step: int, calls: int, alpha: float) -> None:
        self.uses += 1
        self.successes += int(won)
        self.p_hat = ema(self.p_hat, won, alpha)
        self.consecutive_failures = 0 if won else self.consecutive_failures + 1
        self.last_used_step, self.calls = step, self.calls + calls


@dataclasses.dataclass
class SkillRecord:
    id: str
    call_name: str
    title: str
    principle: str
    when_to_apply: str
    category: str = GENERAL           # "general" or a task type
    intent: str = ""
    status: str = "active"            # "active" or "retired" (retired skills are never retrieved)
    provenance: list[dict] = dataclasses.field(default_factory=list)  # created / revised events
    stats: SkillStats = dataclasses.field(default_factory=SkillStats)
    revisions: list[dict] = dataclasses.field(default_factory=list)   # earlier versions
    reviewed_at_uses: int = 0         # stats.uses at the last reflexion (or creation)

    def trigger(self) -> str:
        """The catalog's one-line description."""
        return " ".join((self.when_to_apply or self.intent or self.title).split())

    def content(self) -> str:
        """What a call returns (Fig. 10b)."""
        parts = [f"call_name: {self.call_name}", f"title: {self.title}"]
        if self.intent:
            parts.append(f"intent: {self.intent}")
        parts += [f"principle: {self.principle}", f"when_to_apply: {self.when_to_apply}"]
        return " | ".join(" ".join(p.split()) for p in parts)

    def retrieval_text(self) -> str:
        return f"{self.title}. {self.when_to_apply}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SkillRecord:
        d = dict(d)
        d["stats"] = SkillStats(**d.get("stats", {}))
        known = {f.name for f in dataclasses.fields(cls)}
        if missing := {"id", "title", "principle", "when_to_apply"} - set(d):
            raise ValueError(f"A skill record lacks {sorted(missing)}: {str(d)[:200]}")
        d.setdefault("call_name", call_name(d["title"]))
        return cls(**{k: v for k, v in d.items() if k in known})


def call_name(text: str) -> str:
    """A callable name from a title or id: lower-case words joined by underscores."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "_".join(words[:8]) or "skill"


class EvolvingBank:
    """The skill records, in creation order; ids and call names are unique.

    `naming`: "title" calls a skill by a name made from the teacher's name or title (the paper's
    callable titles); "id" by its id (s0007): one small vocabulary of names, which a tiny policy
    learns to copy from a catalog where it cannot copy words it never wrote (docs/results.md)."""

    def __init__(self, records: Iterable[SkillRecord] = (), next_id: int = 1,
                 naming: str = "title"):
        if naming not in ("title", "id"):
            raise ValueError(f"call names by {naming!r}: choose 'title' or 'id'.")
        self.records: dict[str, SkillRecord] = {}
        self.next_id, self.naming = next_id, naming
        for r in records:
            self._insert(r)

    def _insert(self, r: SkillRecord) -> None:
        if r.id in self.records:
            raise ValueError(f"Two skills with id {r.id!r} in the bank.")
        if any(o.call_name == r.call_name for o in self.records.values()):
            raise ValueError(f"Two skills with call name {r.call_name!r} in the bank.")
        self.records[r.id] = r

    def add(self, *, title: str, principle: str, when_to_apply: str, category: str,
            intent: str = "", name: str = "", provenance: dict | None = None) -> SkillRecord:
        """A new record with a fresh id and a call name unique in the bank (from `name`, else the
        title)."""
        sid = f"s{self.next_id:04d}"
        base = sid if self.naming == "id" else call_name(name or title)
        taken = {r.call_name for r in self.records.values()}
        cname, k = base, 2
        while cname in taken:
            cname, k = f"{base}_{k}", k + 1
        r = SkillRecord(sid, cname, title.strip(), principle.strip(),
                        when_to_apply.strip(), category, intent.strip(),
                        provenance=[provenance] if provenance else [])
        self.next_id += 1
        self._insert(r)
        return r

    def call_by_id(self) -> EvolvingBank:
        """Every skill called by its id from now on (a loaded bank, for `naming="id"`)."""
        self.naming = "id"
        for r in self.records.values():
            r.call_name = r.id
        return self

    def active(self) -> list[SkillRecord]:
        return [r for r in self.records.values() if r.status == "active"]

    def __len__(self) -> int:
        return len(self.active())

    def by_call_name(self, name: str) -> SkillRecord | None:
        for r in self.records.values():
            if r.call_name == name:
                return r
        return None

    def record_outcomes(self, episodes: Iterable[tuple[Sequence[str], bool]], step: int,
                        alpha: float = ALPHA) -> int:
        """Evidence (eq. 7): `episodes` = (ids of the skills called, with repeats; won) per
        episode. One update per (episode, skill). Returns the updates made."""
        n = 0
        for called, won in episodes:
            for sid in dict.fromkeys(called):  # distinct, in call order
                if sid in self.records:
                    self.records[sid].stats.update(won, step, list(called).count(sid), alpha)
                    n += 1
        return n

    def to_json(self) -> dict:
        return {"next_id": self.next_id, "naming": self.naming,
                "skills": [r.to_json() for r in self.records.values()]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | list) -> EvolvingBank:
        """A bank from `to_json()`, or from a bare list of records (hand-written banks)."""
        items = d if isinstance(d, list) else d.get("skills", [])
        bank = cls([SkillRecord.from_json(x) for x in items],
                   naming=(d.get("naming") if isinstance(d, Mapping) else None) or "title")
        bank.next_id = (d.get("next_id") if isinstance(d, Mapping) else None) or max(
            [int(m.group(1)) for r in bank.records.values()
             if (m := re.fullmatch(r"s(\d+)", r.id))], default=0) + 1
        return bank

    @classmethod
    def load(cls, path) -> EvolvingBank:
        with open(path, encoding="utf-8") as f:
            try:
                return cls.from_json(json.load(f))
            except (json.JSONDecodeError, ValueError, TypeError) as e:
                raise ValueError(f"{path} is not a skill bank (a JSON list of skill records or "
                                 f"{{'skills': [...]}}): {e}") from None

    @classmethod
    def from_skill_bank(cls, bank) -> EvolvingBank:
        """Records from a markdown skill bank (`skills.bank.SkillBank`): one per section; a
        section of the general file is general, any other belongs to its task type(s)."""
        from skilljax.skills.bank import GENERAL as GENERAL_FILE, TASK_PREFIX
        out = cls()
        for name in bank.file_names:
            for key, body in bank.sections(name).items():
                if name == GENERAL_FILE:
                    categories = [GENERAL]
                elif key.startswith(TASK_PREFIX) and key[len(TASK_PREFIX):].strip() in \
                        bank.task_types:
                    categories = [key[len(TASK_PREFIX):].strip()]
                else:
                    categories = list(bank.task_types_of(name))
                for cat in categories:
                    label = key[len(TASK_PREFIX):].strip() if key.startswith(TASK_PREFIX) else key
                    title = f"{label.lower()} procedure" if cat != GENERAL else label.lower()
                    out.add(title=title, principle=body, when_to_apply=(
                        f"any {cat} task" if cat != GENERAL else "any task"), category=cat,
                        provenance={"event": "created", "pathway": "hand-written", "step": 0,
                                    "source": f"{bank.directory or ''}:{name}"})
        return out


# ---------------------------------------------------------------------------- calls


_TAG = re.compile(r"<skill>(.*?)</skill>", re.IGNORECASE | re.DOTALL)
_STRAY = re.compile(r"</?skill>", re.IGNORECASE)
_ACTION = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)


@dataclasses.dataclass
class CallResult:
    """What one response's skill tags did."""
    text: str                       # the response with every skill tag removed (for the env)
    names: list[str]                # names in the tags, in order
    skill_id: str | None = None     # the skill resolved (the first tag's), if any
    feedback: str = ""              # appended to the next observation
    problem: str = ""               # a format problem that makes the response invalid


def split_calls(text: str) -> tuple[str, list[str], list[str]]:
    """(text without skill tags, names in the tags, format problems)."""
    problems = []
    inside = any(_TAG.search(m.group(1)) for m in _ACTION.finditer(text))
    if inside:
        problems.append("skill tag inside the action")
    names = [" ".join(m.group(1).split()) for m in _TAG.finditer(text)]
    clean = _TAG.sub("", text)
    if _STRAY.search(clean):
        problems.append("unclosed skill tag")
        clean = _STRAY.sub("", clean)
    if any(not n for n in names):
        problems.append("empty skill tag")
    return clean, [n for n in names if n], problems


@dataclasses.dataclass(frozen=True)
class CatalogConfig:
    general_k: int = 6    # k_g (issue 29; the paper's top-K split into general and task skills)
    specific_k: int = 6   # k_s
    instruction: str = ("Skills (optional): you may add <skill>CALL_NAME</skill> after your "
                        "action to read a skill from the catalog; use a name exactly as listed "
                        "and keep the action format intact.")


class Catalog:
    """The bank as retrieved for one step: catalogs per task, and call resolution."""

    def __init__(self, bank: EvolvingBank, embedder: Embedder, cfg: CatalogConfig = CatalogConfig()):
        self.cfg, self.embedder = cfg, embedder
        self.skills = [dataclasses.replace(r) for r in bank.active()]  # frozen for the step
        self._cache: dict[tuple[str, str], tuple[list[SkillRecord], list[SkillRecord]]] = {}

    def entries(self, description: str, task_type: str) -> tuple[list[SkillRecord],
                                                                    list[SkillRecord]]:
        """(general, task-type) skills for a task, each ranked by similarity (eq. 2)."""
        key = (description, task_type)
        if key not in self._cache:
            out = []
            for pool, k in (([r for r in self.skills if r.category == GENERAL], self.cfg.general_k),
                            ([r for r in self.skills if r.category == task_type],
                             self.cfg.specific_k)):
                if not pool or k <= 0:
                    out.append([])
                    continue
                sims = self.embedder.similarity([description],
                                                [r.retrieval_text() for r in pool])[0]
                out.append([pool[i] for i in top_k(sims, k)])
            self._cache[key] = (out[0], out[1])
        return self._cache[key]

    def text(self, description: str, task_type: str) -> str:
        """The catalog block of a task's prompt ("" when nothing is retrieved)."""
        general, specific = self.entries(description, task_type)
        if not general and not specific:
            return ""
        lines = [self.cfg.instruction] if self.cfg.instruction else []
        for label, rs in (("general", general), ("task", specific)):
            if rs:
                lines.append(f"Skill catalog ({label}):")
                lines += [f"- {r.call_name}: {r.trigger()}" for r in rs]
        return "\n".join(lines)

    def respond(self, description: str, task_type: str, text: str) -> CallResult:
        """Skill tags of one response: the first names a skill of this task's catalog, whose
        content becomes feedback; unknown names and extra tags are reported back."""
        clean, names, problems = split_calls(text)
        res = CallResult(clean, names, problem="; ".join(problems))
        if not names:
            return res
        general, specific = self.entries(description, task_type)
        offered = {r.call_name: r for r in general + specific}
        notes = []
        first = names[0]
        if first in offered:
            res.skill_id = offered[first].id
            notes.append(f"Skill output: {offered[first].content()}")
        else:
            notes.append(f"Unknown skill {first!r}: call a name listed in the skill catalog.")
        if len(names) > 1:
            notes.append(f"Only one skill call per step is read; ignored: {', '.join(names[1:])}.")
        res.feedback = " ".join(notes)
        return res


# ---------------------------------------------------------------------------- metrics


def bank_metrics(bank: EvolvingBank, half_life: float = HALF_LIFE) -> dict[str, Any]:
    """Bank size by category and per-skill p̂ / conf / uses (for metrics.jsonl and plots)."""
    active = bank.active()
    return {
        "bank_size": len(active),
        "bank_general": sum(r.category == GENERAL for r in active),
        "bank_specific": sum(r.category != GENERAL for r in active),
        "skill_stats": {r.id: [round(r.stats.p_hat, 4),
                               round(confidence(r.stats.p_hat, r.stats.uses, half_life), 4),
                               r.stats.uses] for r in active},
    }


def mean_conf(bank: EvolvingBank, half_life: float = HALF_LIFE) -> float:
    used = [r for r in bank.active() if r.stats.uses]
    return float(np.mean([confidence(r.stats.p_hat, r.stats.uses, half_life) for r in used])) \
        if used else 0.0
