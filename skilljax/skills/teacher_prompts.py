"""The four SkillForge teacher prompts (paper 002, appendix A.10, Figs. 11–13, in our own words)
and the validators of their JSON answers.

Each builder returns a `teachers.Prompt`: the text an LLM teacher reads, plus `kind` and `data`
(the same inputs, structured) for the rule-based teacher. Everything the answer may depend on is in
the text, so a replay cache keyed by the text replays any teacher exactly.

An *episode* (the raw trajectory handed to abstraction) is a dict:
`{"task": description, "task_type": str, "outcome": "SUCCESS" | "FAILURE",
  "steps": [{"action": str, "observation": str, "applied": bool, "skill": call name or ""}]}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from skilljax.skills.teachers import Prompt

RELEVANCE = ("causal", "incidental", "harmful")
PATHWAYS = ("extraction", "refinement", "contrastive")


def _oneline(s: str) -> str:
    return " ".join(str(s).split())


def trajectory_text(episode: Mapping[str, Any], max_chars: int = 200) -> str:
    lines = []
    for i, s in enumerate(episode["steps"], 1):
        skill = f" [SKILL_CALL {s['skill']}]" if s.get("skill") else ""
        applied = "" if s.get("applied", True) else " (not applied)"
        lines.append(f"step {i}: action: {_oneline(s['action']) or '(none)'}{applied}{skill} | "
                     f"observation: {_oneline(s['observation'])[:max_chars]}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- abstraction


def abstraction(episode: Mapping[str, Any], domain: str = "", rules: str = "") -> Prompt:
    text = f"""You summarise one raw trajectory of an RL agent into a reusable abstraction for its skill bank.
Task: {_oneline(episode['task'])}
Task type: {episode['task_type']}
Domain: {domain or 'text environment'}
Outcome: {episode['outcome']}
Domain guidance: {rules or 'none'}
Answer with one JSON object with exactly these keys:
- "contextual_description": one to three sentences on the situation;
- "refined_trajectory": the decisive steps in order, each {{"step_index", "action", "critical_observation", "reasoning"}};
- "strategic_guidelines": {{"planning_pattern", "mistakes_to_avoid"}}. On SUCCESS, planning_pattern is a reusable chain of actions (one string) and mistakes_to_avoid is []. On FAILURE, planning_pattern is null and mistakes_to_avoid lists {{"trigger_condition", "bad_action"}} pairs in general terms.
Keep only the steps that mattered; do not copy the whole trajectory. Answer with JSON only.
Raw trajectory:
{trajectory_text(episode)}"""
    return Prompt(text, "abstraction", {"episode": dict(episode)})


def check_abstraction(obj: Any) -> dict:
    if not isinstance(obj, dict):
        raise ValueError("the abstraction is not a JSON object")
    for key in ("contextual_description", "refined_trajectory", "strategic_guidelines"):
        if key not in obj:
            raise ValueError(f"the abstraction lacks {key!r}")
    if not isinstance(obj["refined_trajectory"], list):
        raise ValueError("refined_trajectory is not a list")
    g = obj["strategic_guidelines"]
    if not isinstance(g, dict) or "planning_pattern" not in g or "mistakes_to_avoid" not in g:
        raise ValueError("strategic_guidelines needs planning_pattern and mistakes_to_avoid")
    if g["planning_pattern"] is not None and not isinstance(g["planning_pattern"], str):
        raise ValueError("planning_pattern is neither a string nor null")
    if not isinstance(g["mistakes_to_avoid"], list):
        raise ValueError("mistakes_to_avoid is not a list")
    return {"contextual_description": _oneline(obj["contextual_description"]),
            "refined_trajectory": obj["refined_trajectory"],
            "strategic_guidelines": {"planning_pattern": g["planning_pattern"],
                                     "mistakes_to_avoid": g["mistakes_to_avoid"]}}


# ---------------------------------------------------------------------------- induction


def _summary(item: Mapping[str, Any]) -> dict:
    """An abstraction as shown to the induction prompt: the task with its summary."""
    return {"task": item["task"], "task_type": item["task_type"],
            "summary": item["abstraction"]}


def induction(task_type: str, mode: str, successes: Sequence[Mapping], failures: Sequence[Mapping],
              existing: Sequence[Mapping], *, max_new: int, success_counts: Mapping[str, int],
              failure_counts: Mapping[str, int], rules: str = "") -> Prompt:
    """`successes`/`failures`: {"task", "task_type", "abstraction"} items; `existing`: the bank's
    records as {"title", "principle", "when_to_apply", "category"}."""
    if mode not in PATHWAYS:
        raise ValueError(f"induction mode {mode!r}; pathways: {PATHWAYS}")
    succ = [_summary(x) for x in successes]
    fail = [_summary(x) for x in failures]
    text = f"""You grow the reusable skill bank of an RL agent from trajectory summaries: propose NEW skills the agent can call by name in later episodes.
Routing: dominant task type: {task_type} | domain guidance: {rules or 'none'}
Failed task types (counts): {json.dumps(dict(failure_counts), sort_keys=True)}
Successful task types (counts): {json.dumps(dict(success_counts), sort_keys=True)}
Pathway: {mode} ({'decision patterns shared by the successes' if mode == 'extraction' else 'corrections of the recurring failure patterns' if mode == 'refinement' else 'the behaviour that separates successes from failures'}).
Rules:
- Abstract reusable decision patterns from the successful trajectories; use failures to sharpen when_to_apply.
- Compare at the level of the task type, not of one task instance.
- No generic advice; no duplicate of an existing skill's title or intent.
Answer with a JSON array of 1 to {max_new} skills, each {{"skill_id", "title" (3-8 words), "principle", "when_to_apply" (an explicit trigger)}} and optionally "intent" and "category" ("general" or the task type).
SUCCESSFUL TRAJECTORIES: {json.dumps(succ, sort_keys=True)}
FAILED TRAJECTORIES: {json.dumps(fail, sort_keys=True)}
EXISTING SKILLS: {json.dumps([dict(x) for x in existing], sort_keys=True)}"""
    return Prompt(text, "induction", {
        "task_type": task_type, "mode": mode, "successes": [dict(x) for x in successes],
        "failures": [dict(x) for x in failures], "existing": [dict(x) for x in existing],
        "max_new": max_new})


def check_induction(obj: Any, max_new: int) -> list[dict]:
    if isinstance(obj, dict) and isinstance(obj.get("skills"), list):
        obj = obj["skills"]
    if isinstance(obj, dict):
        obj = [obj]
    if not isinstance(obj, list):  # [] is an answer: nothing new worth a skill
        raise ValueError("the induction answer is not a JSON array of skills")
    out = []
    for s in obj[:max_new]:
        if not isinstance(s, dict):
            raise ValueError("a skill is not a JSON object")
        for key in ("title", "principle", "when_to_apply"):
            if not isinstance(s.get(key), str) or not s[key].strip():
                raise ValueError(f"a skill lacks a non-empty {key!r}")
        out.append({"skill_id": _oneline(s.get("skill_id", "")), "title": _oneline(s["title"]),
                    "principle": s["principle"].strip(),
                    "when_to_apply": _oneline(s["when_to_apply"]),
                    "intent": _oneline(s.get("intent", "") or ""),
                    "category": _oneline(s.get("category", "") or "")})
    return out


# ---------------------------------------------------------------------------- reflexion


def _skill_lines(skill: Mapping[str, Any]) -> str:
    return (f"skill_id: {skill['id']} | title: {skill['title']}\nprinciple: "
            f"{_oneline(skill['principle'])} | when_to_apply: {_oneline(skill['when_to_apply'])}")


def attribution(skill: Mapping[str, Any], episode: Mapping[str, Any]) -> Prompt:
    """Fig. 13a: how one episode used the skill under review."""
    text = f"""You assess how one skill was used in one trajectory of an RL agent.
SKILL UNDER REVIEW:
{_skill_lines(skill)}
TASK: {_oneline(episode['task'])}
OUTCOME: {episode['outcome']}
TRAJECTORY (skill calls marked SKILL_CALL):
{trajectory_text(episode)}
Answer with one JSON object:
- "contextual_description": one or two sentences on the task;
- "refined_trajectory": the key steps (at most 80 characters each), the skill call marked [SKILL_CALL];
- "skill_relevance": "causal" (the skill caused the success or failure), "incidental" (used, but the outcome did not depend on it) or "harmful" (it made the outcome worse);
- "relevance_reasoning": one sentence."""
    return Prompt(text, "attribution", {"skill": dict(skill), "episode": dict(episode)})


def check_attribution(obj: Any) -> dict:
    if not isinstance(obj, dict) or obj.get("skill_relevance") not in RELEVANCE:
        raise ValueError(f"skill_relevance must be one of {RELEVANCE}")
    return {"contextual_description": _oneline(obj.get("contextual_description", "")),
            "skill_relevance": obj["skill_relevance"],
            "relevance_reasoning": _oneline(obj.get("relevance_reasoning", ""))}


def reflexion(skill: Mapping[str, Any], contexts: Sequence[Mapping[str, Any]],
              recent: Sequence[Mapping[str, Any]] = ()) -> Prompt:
    """Fig. 13b: keep or revise a flagged skill. `contexts`: {"task", "outcome", "summary",
    "relevance"} per usage; `recent`: recent successful abstractions of the skill's task type
    ({"task", "abstraction"}), evidence of what works now."""
    st = skill["stats"]
    rate = st["successes"] / st["uses"] if st["uses"] else 0.0
    ctx = "\n".join(f"Context {i} [{c['outcome']}]: Task: {_oneline(c['task'])} | Summary: "
                    f"{_oneline(c['summary'])} | Skill relevance: {c['relevance']}"
                    for i, c in enumerate(contexts, 1)) or "(none recorded)"
    rec = "\n".join(f"- {_oneline(r['task'])}: "
                    f"{r['abstraction']['strategic_guidelines']['planning_pattern']}"
                    for r in recent) or "(none)"
    text = f"""You review whether a skill used by an RL agent works.
SKILL:
{_skill_lines(skill)}
total_uses: {st['uses']} | success_uses: {st['successes']} | success_rate: {rate:.1%} | ema_success: {st['p_hat']:.3f} | consecutive_failures: {st['consecutive_failures']}
USAGE CONTEXTS:
{ctx}
RECENT SUCCESSFUL PATTERNS OF THIS TASK TYPE:
{rec}
Judge the whole history ({st['uses']} uses, {st['successes']} successes, {rate:.1%}): a skill with a good overall success rate is not revised for a few recent failures.
Choose ONE verdict: "keep" (the skill works; no change) or "revise" (its principle or when_to_apply should change).
Answer with one JSON object: "verdict", "reasoning" (one or two sentences), and, only for revise, "revised_principle" and "revised_when_to_apply"."""
    return Prompt(text, "reflexion", {"skill": dict(skill), "contexts": [dict(c) for c in contexts],
                                      "recent": [dict(r) for r in recent]})


def check_reflexion(obj: Any) -> dict:
    if not isinstance(obj, dict) or obj.get("verdict") not in ("keep", "revise"):
        raise ValueError("verdict must be 'keep' or 'revise'")
    out = {"verdict": obj["verdict"], "reasoning": _oneline(obj.get("reasoning", ""))}
    if obj["verdict"] == "revise":
        p, w = obj.get("revised_principle"), obj.get("revised_when_to_apply")
        if not (isinstance(p, str) and p.strip()) and not (isinstance(w, str) and w.strip()):
            raise ValueError("a revise verdict needs revised_principle or revised_when_to_apply")
        out["revised_principle"] = p.strip() if isinstance(p, str) and p.strip() else None
        out["revised_when_to_apply"] = _oneline(w) if isinstance(w, str) and w.strip() else None
    return out
