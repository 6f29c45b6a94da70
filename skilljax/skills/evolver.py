"""SkillForge's evolution step (paper 002 §3.3, Algorithm 1): every I training steps, trajectory
abstraction, multi-pathway induction, deduplication and reflexion, through one teacher.

`Evolver.observe(episodes, step)` runs after every rollout: evidence for the called skills
(`EvolvingBank.record_outcomes`, eq. 7) and the episodes kept for the next evolution step.
`Evolver.evolve(step)` then:
1. abstracts the most recent episodes of each task type and outcome (Fig. 11) into per-type
   buffers of successes and failures;
2. induces new skills for the task types with the most failures (Fig. 12; eq. 6's mode:
   contrastive when the type has both successes and failures, extraction with successes only,
   refinement with failures only);
3. drops candidates that duplicate a skill already in the bank or an earlier candidate (same
   title, word overlap, or embedding similarity);
4. reviews the skills with the highest underperformance score conf(s) (eq. 8) that gained
   `review_after_uses` uses since their last review: attribution of their recent usage episodes
   (Fig. 13a), then a keep / revise verdict (Fig. 13b). A revision keeps the statistics and
   records the earlier version.
A teacher answer that stays malformed after its retries is skipped, with the reason logged and
counted (`teacher_failures`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skilljax.skills import teacher_prompts as tp
from skilljax.skills.evolution import (GENERAL, Catalog, CatalogConfig, EvolvingBank, bank_metrics,
                                       confidence)
from skilljax.skills.retrieval import Embedder
from skilljax.skills.teachers import complete_json, complete_json_many


@dataclasses.dataclass(frozen=True)
class EvolutionConfig:
    every: int = 5                      # I (paper 002 §4.2)
    alpha: float = 0.1                  # EMA α (eq. 7)
    half_life: float = 20.0             # h (eq. 8)
    max_new_skills: int = 3             # per induction call (Fig. 12's max_new_skills)
    induction: bool = True
    contrastive: bool = True            # off: both outcomes present → extraction (ablation)
    dedup: bool = True
    reflexion: bool = True
    types_per_induction: int = 1        # task types routed to induction per evolution step
    abstract_per_type: int = 4          # episodes abstracted per task type and outcome per step
    buffer_size: int = 8                # abstractions kept per task type and outcome
    reflexion_top: int = 2              # skills reviewed per evolution step
    reflexion_min_conf: float = 0.05    # ... with at least this conf(s)
    review_after_uses: int = 5          # uses since the last review before another
    reflexion_contexts: int = 3         # usage episodes shown per review
    dedup_lexical: float = 0.8          # word-set Jaccard of title + principle
    dedup_semantic: float = 0.9         # embedding cosine of title + principle + when_to_apply
    retries: int = 2                    # extra tries for a malformed teacher answer
    domain: str = ""
    domain_rules: str = ""


NOTHING = "Nothing happens"


def episodes_from(trajectories) -> list[dict]:
    """Rollout trajectories (`rl.rollout.Trajectory`) as the episodes `Evolver.observe` takes."""
    out = []
    for t in trajectories:
        by_step = {c["step"]: c for c in t.calls}
        # Applied: the env took the action and something happened (chores and ALFWorld answer an
        # admissible action that does nothing with "Nothing happens.").
        steps = [{"action": a, "observation": o, "applied": bool(v) and NOTHING not in o,
                  "skill": (by_step[k]["names"][0] if k in by_step else "")}
                 for k, (a, o, v) in enumerate(zip(t.actions, t.observations, t.env_valid))]
        out.append({"task": t.goal or t.task.id, "task_type": t.task.type,
                    "outcome": "SUCCESS" if t.won else "FAILURE", "steps": steps,
                    "called": [c["skill_id"] for c in t.calls if c["skill_id"]]})
    return out


def _words(s: str) -> set[str]:
    return set(re.findall(r"[a-z0-9<>]+", s.lower()))


def duplicate_reason(candidate: Mapping[str, str], existing: Sequence[Mapping[str, str]],
                     embedder: Embedder | None, lexical: float, semantic: float) -> str:
    """Why `candidate` duplicates one of `existing` ("" if it does not): the same title, a word
    overlap (Jaccard of title + principle) ≥ `lexical`, or an embedding cosine ≥ `semantic`."""
    if not existing:
        return ""
    title = " ".join(candidate["title"].lower().split())
    words = _words(candidate["title"] + " " + candidate["principle"])
    for e in existing:
        if " ".join(e["title"].lower().split()) == title:
            return f"same title as {e['title']!r}"
        other = _words(e["title"] + " " + e["principle"])
        union = words | other
        if union and len(words & other) / len(union) >= lexical:
            return f"word overlap with {e['title']!r}"
    if embedder is not None:
        text = lambda s: f"{s['title']}. {s['principle']} {s['when_to_apply']}"
        sims = embedder.similarity([text(candidate)], [text(e) for e in existing])[0]
        j = int(sims.argmax())
        if sims[j] >= semantic:
            return f"similar to {existing[j]['title']!r} (cosine {sims[j]:.2f})"
    return ""


class Evolver:
    """The bank's evolution between jitted steps; its state is host state saved in checkpoints."""

    def __init__(self, bank: EvolvingBank, teacher, embedder: Embedder | None,
                 cfg: EvolutionConfig = EvolutionConfig(), log: Callable[[str], None] | None = None,
                 catalog: CatalogConfig = CatalogConfig()):
        self.bank, self.teacher, self.embedder, self.cfg = bank, teacher, embedder, cfg
        self.catalog_cfg = catalog
        self.log = log or logging.getLogger(__name__).warning
        self.pending: list[dict] = []                    # episodes since the last evolution
        self.buffers: dict[str, dict[str, list[dict]]] = {}   # type → outcome → abstractions
        self.usage: dict[str, list[dict]] = {}           # skill id → recent episodes calling it
        self.totals = collections.Counter()              # induced, deduplicated, revised, ...
        self.events: list[dict] = []                     # one line per bank change

    # ------------------------------------------------------------------ every step

    def observe(self, episodes: Sequence[Mapping[str, Any]], step: int) -> dict[str, float]:
        """Evidence from one rollout. `episodes`: dicts in `teacher_prompts`' episode format plus
        "called": the ids of the skills resolved, one per call."""
        self.bank.record_outcomes(((e["called"], e["outcome"] == "SUCCESS") for e in episodes),
                                  step, self.cfg.alpha)
        for e in episodes:
            self.pending.append(dict(e))
            for sid in dict.fromkeys(e["called"]):
                self.usage.setdefault(sid, []).append(dict(e))
                del self.usage[sid][:-self.cfg.reflexion_contexts]
        keep = 2 * self.cfg.abstract_per_type  # most recent per (type, outcome) is all we use
        seen = collections.Counter()
        kept = []
        for e in reversed(self.pending):
            k = (e["task_type"], e["outcome"])
            if seen[k] < keep:
                kept.append(e)
                seen[k] += 1
        self.pending = kept[::-1]
        calls = sum(len(e["called"]) for e in episodes)
        return {"skill_calls_resolved": calls,
                "episodes_calling": sum(bool(e["called"]) for e in episodes)}

    def catalog(self) -> Catalog:
        """The bank as the next rollout sees it."""
        return Catalog(self.bank, self.embedder, self.catalog_cfg)

    def metrics(self) -> dict[str, Any]:
        return bank_metrics(self.bank, self.cfg.half_life)

    def write(self, directory) -> None:
        """`DIR/bank.json` (the records) and `DIR/evolution.json` (counters and events), through
        a temporary file each."""
        from skilljax.config import write_json
        from etils import epath
        directory = epath.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / "bank.json", self.bank.to_json())
        write_json(directory / "evolution.json", {"totals": dict(self.totals),
                                                  "events": self.events})

    def due(self, step: int) -> bool:
        return self.cfg.every > 0 and step % self.cfg.every == 0

    # ------------------------------------------------------------------ every I steps

    def evolve(self, step: int) -> dict[str, Any]:
        before = collections.Counter(self.totals)
        new_types = self._abstract()
        if self.cfg.induction:
            for ttype in new_types[:self.cfg.types_per_induction]:
                self._induce(ttype, step)
        if self.cfg.reflexion:
            self._reflect(step)
        self.pending = []
        delta = {k: self.totals[k] - before[k] for k in
                 ("induced", "deduplicated", "revised", "kept", "reviewed", "teacher_failures",
                  "abstracted")}
        return {f"evolution_{k}": v for k, v in delta.items()}

    def _abstract(self) -> list[str]:
        """Abstractions of the pending episodes into the buffers; the task types that got new
        ones, most failures first (then most successes, then name)."""
        chosen, counts = [], collections.Counter()
        by_key: dict[tuple[str, str], list[dict]] = {}
        for e in self.pending:
            by_key.setdefault((e["task_type"], e["outcome"]), []).append(e)
        for (ttype, outcome), eps in sorted(by_key.items()):
            chosen += eps[-self.cfg.abstract_per_type:]
        prompts = [tp.abstraction(e, self.cfg.domain, self.cfg.domain_rules) for e in chosen]
        answers = complete_json_many(self.teacher, prompts, tp.check_abstraction,
                                     retries=self.cfg.retries, log=self.log)
        for e, a in zip(chosen, answers):
            if a is None:
                self.totals["teacher_failures"] += 1
                continue
            self.totals["abstracted"] += 1
            key = "success" if e["outcome"] == "SUCCESS" else "failure"
            buf = self.buffers.setdefault(e["task_type"], {"success": [], "failure": []})[key]
            buf.append({"task": e["task"], "task_type": e["task_type"], "abstraction": a})
            del buf[:-self.cfg.buffer_size]
            counts[(e["task_type"], key)] += 1
        types = sorted({t for t, _ in counts},
                       key=lambda t: (-counts[(t, "failure")], -counts[(t, "success")], t))
        self._last_counts = counts
        return types

    def _induce(self, ttype: str, step: int) -> None:
        buf = self.buffers.get(ttype, {"success": [], "failure": []})
        succ, fail = buf["success"], buf["failure"]
        if succ and fail:
            mode = "contrastive" if self.cfg.contrastive else "extraction"
        else:
            mode = "extraction" if succ else "refinement"
        if mode == "extraction":
            fail = []
        counts = self._last_counts
        prompt = tp.induction(
            ttype, mode, succ, fail,
            [{"title": r.title, "principle": r.principle, "when_to_apply": r.when_to_apply,
              "category": r.category} for r in self.bank.active()],
            max_new=self.cfg.max_new_skills,
            success_counts={t: n for (t, k), n in sorted(counts.items()) if k == "success"},
            failure_counts={t: n for (t, k), n in sorted(counts.items()) if k == "failure"},
            rules=self.cfg.domain_rules)
        skills = complete_json(self.teacher, prompt,
                               lambda o: tp.check_induction(o, self.cfg.max_new_skills),
                               retries=self.cfg.retries, log=self.log)
        if skills is None:
            self.totals["teacher_failures"] += 1
            return
        existing = [{"title": r.title, "principle": r.principle, "when_to_apply": r.when_to_apply}
                    for r in self.bank.active()]
        for s in skills:
            reason = duplicate_reason(s, existing, self.embedder, self.cfg.dedup_lexical,
                                      self.cfg.dedup_semantic) if self.cfg.dedup else ""
            if reason:
                self.totals["deduplicated"] += 1
                self.events.append({"step": step, "event": "deduplicated", "title": s["title"],
                                    "reason": reason})
                continue
            category = GENERAL if s["category"].lower() == GENERAL else ttype
            r = self.bank.add(title=s["title"], principle=s["principle"],
                              when_to_apply=s["when_to_apply"], category=category,
                              intent=s["intent"], name=s["skill_id"],
                              provenance={"event": "created", "pathway": mode, "step": step,
                                          "teacher": getattr(self.teacher, "name", "")})
            existing.append(s)
            self.totals["induced"] += 1
            self.events.append({"step": step, "event": "induced", "id": r.id, "pathway": mode,
                                "title": r.title, "principle": r.principle})

    def _reflect(self, step: int) -> None:
        h = self.cfg.half_life
        due = [r for r in self.bank.active()
               if r.stats.uses - r.reviewed_at_uses >= self.cfg.review_after_uses
               and confidence(r.stats.p_hat, r.stats.uses, h) >= self.cfg.reflexion_min_conf]
        due.sort(key=lambda r: (-confidence(r.stats.p_hat, r.stats.uses, h), r.id))
        for r in due[:self.cfg.reflexion_top]:
            skill = r.to_json()
            episodes = self.usage.get(r.id, [])[-self.cfg.reflexion_contexts:]
            attributions = complete_json_many(
                self.teacher, [tp.attribution(skill, e) for e in episodes], tp.check_attribution,
                retries=self.cfg.retries, log=self.log)
            contexts = [{"task": e["task"], "outcome": e["outcome"],
                         "summary": a["contextual_description"], "relevance": a["skill_relevance"]}
                        for e, a in zip(episodes, attributions) if a is not None]
            self.totals["teacher_failures"] += sum(a is None for a in attributions)
            recent = (self.buffers.get(r.category, {}).get("success", [])
                      if r.category != GENERAL else [])
            verdict = complete_json(self.teacher, tp.reflexion(skill, contexts, recent[-4:]),
                                    tp.check_reflexion, retries=self.cfg.retries, log=self.log)
            self.totals["reviewed"] += 1
            r.reviewed_at_uses = r.stats.uses
            if verdict is None:
                self.totals["teacher_failures"] += 1
                continue
            if verdict["verdict"] == "keep":
                self.totals["kept"] += 1
                continue
            r.revisions.append({"step": step, "principle": r.principle,
                                "when_to_apply": r.when_to_apply, "reasoning": verdict["reasoning"],
                                "stats": dataclasses.asdict(r.stats)})
            r.principle = verdict["revised_principle"] or r.principle
            r.when_to_apply = verdict["revised_when_to_apply"] or r.when_to_apply
            r.provenance.append({"event": "revised", "pathway": "reflexion", "step": step,
                                 "teacher": getattr(self.teacher, "name", "")})
            self.totals["revised"] += 1
            self.events.append({"step": step, "event": "revised", "id": r.id,
                                "principle": r.principle, "reasoning": verdict["reasoning"]})

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {"bank": self.bank.to_json(), "pending": self.pending, "buffers": self.buffers,
                "usage": self.usage, "totals": dict(self.totals), "events": self.events}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.bank = EvolvingBank.from_json(d["bank"])
        self.pending, self.buffers = list(d["pending"]), dict(d["buffers"])
        self.usage = {k: list(v) for k, v in d["usage"].items()}
        self.totals = collections.Counter(d["totals"])
        self.events = list(d["events"])
