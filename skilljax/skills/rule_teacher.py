"""A teacher that needs no LLM: skills induced from trajectories alone, for CPU-scale runs.

It answers the four SkillForge prompts (`teacher_prompts`) from their structured `data`, with JSON
in the shape an LLM teacher returns, so the evolution path is the same for every teacher. What it
reads is what the agent saw: the task description, its own actions, the observations and whether
the env applied each action. It never reads an environment's hidden solution.

- Abstraction: the words of the task description that the episode's actions take as arguments
  become placeholders `<A>`, `<B>`, ... in order of their first appearance in the description, so
  episodes of one task template share one abstract form. A success's planning pattern is its chain
  of applied actions (rejected ones dropped, repeats collapsed) in that form; a failure's mistakes
  are the actions the env rejected.
- Induction: per task type, the planning pattern shared by the most successes (at least
  `min_support`) becomes a skill; the contrastive pathway adds the actions the env rejected in at
  least `min_support` failures and no success took (`avoid: ...`); refinement, with failures
  only, makes an avoid-list skill. A pattern an existing
  skill already states is not proposed again.
- Attribution: causal when the episode followed the skill's steps in order, else incidental;
  harmful when it followed them and failed.
- Reflexion: revise to the pattern most recent successes of the type share when it differs from
  the skill's, else keep.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from skilljax.skills.teachers import TeacherError

STOP = frozenset("a an the in on to it of and with at from into under is its for by then".split())
ARROW = " -> "


def placeholders(task: str, actions: Sequence[str]) -> dict[str, str]:
    """word → "<A>", ...: words of the task that some action takes as an argument."""
    args = {w for a in actions for w in re.findall(r"[a-z0-9]+", a.lower())[1:]}
    out: dict[str, str] = {}
    for w in re.findall(r"[a-z0-9]+", task.lower()):
        if w in args and w not in STOP and w not in out and len(out) < 26:
            out[w] = f"<{chr(ord('A') + len(out))}>"
    return out


def abstract(text: str, mapping: Mapping[str, str]) -> str:
    return re.sub(r"[a-z0-9]+", lambda m: mapping.get(m.group(0), m.group(0)),
                  " ".join(text.lower().split()))


def _first_sentence(task: str) -> str:
    return re.split(r"(?<=[.!?])\s", " ".join(task.split()), maxsplit=1)[0]


def episode_forms(episode: Mapping[str, Any]) -> tuple[str, list[str], list[str]]:
    """(abstract task sentence, applied-action chain, rejected actions), all abstracted."""
    steps = episode["steps"]
    mapping = placeholders(episode["task"], [s["action"] for s in steps])
    chain: list[str] = []
    for s in steps:
        a = abstract(s["action"], mapping)
        if s.get("applied", True) and a and (not chain or chain[-1] != a):
            chain.append(a)
    rejected = [abstract(s["action"], mapping) for s in steps
                if not s.get("applied", True) and s["action"].strip()]
    return abstract(_first_sentence(episode["task"]), mapping), chain, rejected


def _follows(chain: Sequence[str], steps: Sequence[str]) -> bool:
    """`steps` appear in `chain` in order (not necessarily adjacent)."""
    it = iter(chain)
    return bool(steps) and all(any(c == s for c in it) for s in steps)


def _steps_of(principle: str) -> list[str]:
    head = principle.split(";")[0]
    head = head.split(":", 1)[1] if head.lower().startswith("steps:") else head
    return [s.strip() for s in head.split(",") if s.strip()]


class RuleTeacher:
    """Answers SkillForge prompts by rules over the trajectories (see the module docstring)."""

    name = "rule"

    def __init__(self, min_support: int = 2, max_avoid: int = 2):
        self.min_support, self.max_avoid = min_support, max_avoid

    def complete(self, prompt: str) -> str:
        kind, data = getattr(prompt, "kind", ""), getattr(prompt, "data", None)
        handler = {"abstraction": self._abstraction, "induction": self._induction,
                   "attribution": self._attribution, "reflexion": self._reflexion}.get(kind)
        if handler is None or data is None:
            raise TeacherError("The rule teacher answers only skilljax's SkillForge prompts "
                               f"(teacher_prompts.*), not a plain string (kind {kind!r}).")
        return json.dumps(handler(data))

    # ------------------------------------------------------------------ the four prompts

    def _abstraction(self, d: Mapping[str, Any]) -> dict:
        ep = d["episode"]
        sentence, chain, rejected = episode_forms(ep)
        won = ep["outcome"] == "SUCCESS"
        return {
            "contextual_description": f"A {ep['task_type']} task: {sentence}",
            "refined_trajectory": [{"step_index": i, "action": a, "critical_observation": "",
                                    "reasoning": ""} for i, a in enumerate(chain, 1)],
            "strategic_guidelines": {
                "planning_pattern": ARROW.join(chain) if won else None,
                "mistakes_to_avoid": [] if won else [
                    {"trigger_condition": f"a task like '{sentence}'", "bad_action": a}
                    for a in dict.fromkeys(rejected)]},
        }

    def _induction(self, d: Mapping[str, Any]) -> list[dict]:
        ttype, mode = d["task_type"], d["mode"]
        succ, fail = d["successes"], d["failures"]
        patterns = collections.Counter(
            s["abstraction"]["strategic_guidelines"]["planning_pattern"] for s in succ
            if s["abstraction"]["strategic_guidelines"]["planning_pattern"])
        sentences = collections.Counter(
            s["abstraction"]["contextual_description"].split(": ", 1)[-1] for s in succ + fail)
        trigger = f"the task reads like: {sentences.most_common(1)[0][0]}" if sentences else \
            f"any {ttype} task"
        # Named by the task's first word (its verb, in most task templates), else the type.
        verb = (re.findall(r"[a-z0-9]+", trigger.split(": ", 1)[-1]) or [ttype])[0] \
            if sentences else ttype
        existing = {_norm(e["principle"]) for e in d["existing"]}
        avoid = self._avoid(fail, patterns) if mode in ("contrastive", "refinement") else []
        out = []
        for pattern, n in patterns.most_common():
            if n < self.min_support or len(out) >= d["max_new"]:
                break
            steps = pattern.split(ARROW)
            principle = "steps: " + ", ".join(steps) + (f"; avoid: {', '.join(avoid)}"
                                                        if avoid else "")
            if _norm(principle) in existing:
                continue
            words = [w for s in steps for w in s.split() if not w.startswith("<")]
            title = " ".join([verb, "steps:"] + list(dict.fromkeys(words)))
            out.append({"skill_id": f"{verb}_steps", "title": " ".join(title.split()[:8]),
                        "principle": principle, "when_to_apply": trigger,
                        "intent": "<A>, <B>: what the task names, in order",
                        "category": ttype})
        if not out and mode == "refinement" and avoid:
            principle = f"avoid: {', '.join(avoid)}"
            if _norm(principle) not in existing:
                out.append({"skill_id": f"{verb}_pitfalls", "title": f"{verb} pitfalls",
                            "principle": principle, "when_to_apply": trigger,
                            "intent": f"steer clear of actions that failed {ttype} tasks",
                            "category": ttype})
        return out

    def _avoid(self, failures: Sequence[Mapping], patterns: Mapping[str, int]) -> list[str]:
        """Actions the env rejected in at least `min_support` failures that no successful
        pattern contains (undecodable text is never an action to name)."""
        good = {s for p in patterns for s in p.split(ARROW)}
        bad = collections.Counter(
            a for f in failures for a in dict.fromkeys(
                m["bad_action"] for m in f["abstraction"]["strategic_guidelines"]
                ["mistakes_to_avoid"] if isinstance(m, dict) and m.get("bad_action"))
            if a not in good and "\ufffd" not in a)
        return [a for a, n in bad.most_common() if n >= self.min_support][:self.max_avoid]

    def _attribution(self, d: Mapping[str, Any]) -> dict:
        ep, skill = d["episode"], d["skill"]
        sentence, chain, _ = episode_forms(ep)
        followed = _follows(chain, _steps_of(skill["principle"]))
        won = ep["outcome"] == "SUCCESS"
        relevance = ("causal" if won else "harmful") if followed else "incidental"
        return {"contextual_description": f"A {ep['task_type']} task: {sentence}",
                "refined_trajectory": chain, "skill_relevance": relevance,
                "relevance_reasoning": ("the episode followed the skill's steps" if followed
                                        else "the episode did not follow the skill's steps")}

    def _reflexion(self, d: Mapping[str, Any]) -> dict:
        skill = d["skill"]
        patterns = collections.Counter(
            r["abstraction"]["strategic_guidelines"]["planning_pattern"] for r in d["recent"]
            if r["abstraction"]["strategic_guidelines"]["planning_pattern"])
        if patterns:
            best = patterns.most_common(1)[0][0].split(ARROW)
            if best != _steps_of(skill["principle"]):
                return {"verdict": "revise",
                        "reasoning": "recent successes of this task type follow other steps",
                        "revised_principle": "steps: " + ", ".join(best),
                        "revised_when_to_apply": None}
        return {"verdict": "keep", "reasoning": "no successful pattern contradicts the skill"}


def _norm(s: str) -> str:
    return " ".join(s.lower().split())
