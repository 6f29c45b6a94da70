"""The rule-based teacher: abstraction by placeholders, induction by support, the contrastive and
refinement pathways, attribution and reflexion verdicts, all by hand."""

import json

import pytest

from skilljax.skills import teacher_prompts as tp
from skilljax.skills.rule_teacher import RuleTeacher, abstract, episode_forms, placeholders
from skilljax.skills.teachers import TeacherError


def episode(task, actions, won, applied=None, ttype="heat"):
    applied = applied or [True] * len(actions)
    return {"task": task, "task_type": ttype, "outcome": "SUCCESS" if won else "FAILURE",
            "steps": [{"action": a, "observation": "ok" if v else "Nothing happens.",
                       "applied": v, "skill": ""} for a, v in zip(actions, applied)]}


HEAT = "heat the {o} and put it in the {d}. The {o} is in the kitchen."


def heat_win(o="egg", d="counter", extra=()):
    return episode(HEAT.format(o=o, d=d), ["take " + o, *extra, "use heater", f"put {o} in {d}"],
                   True)


def ask(teacher, prompt):
    return json.loads(teacher.complete(prompt))


def test_placeholders_follow_the_task_words_the_actions_use():
    m = placeholders(HEAT.format(o="egg", d="desk"), ["take egg", "use heater", "put egg in desk"])
    assert m == {"egg": "<A>", "desk": "<B>"}       # "in", "it", "the" are never placeholders
    assert abstract("put egg in desk", m) == "put <A> in <B>"
    sentence, chain, rejected = episode_forms(episode(
        HEAT.format(o="egg", d="desk"),
        ["take egg", "use fan", "take egg", "take egg", "use heater", "put egg in desk"], True,
        [True, False, True, True, True, True]))
    assert sentence == "heat the <A> and put it in the <B>."
    assert chain == ["take <A>", "use heater", "put <A> in <B>"]   # repeats collapsed
    assert rejected == ["use fan"]


def test_abstraction_answers_as_an_llm_would():
    t = RuleTeacher()
    win = tp.check_abstraction(ask(t, tp.abstraction(heat_win())))
    assert win["strategic_guidelines"] == {
        "planning_pattern": "take <A> -> use heater -> put <A> in <B>", "mistakes_to_avoid": []}
    lose = ask(t, tp.abstraction(episode(HEAT.format(o="egg", d="desk"),
                                         ["take egg", "use fan"], False, [True, False])))
    assert lose["strategic_guidelines"]["planning_pattern"] is None
    assert [m["bad_action"] for m in lose["strategic_guidelines"]["mistakes_to_avoid"]] == \
        ["use fan"]
    with pytest.raises(TeacherError, match="only skilljax's SkillForge prompts"):
        t.complete("a plain string")


def _items(teacher, episodes):
    return [{"task": e["task"], "task_type": e["task_type"],
             "abstraction": ask(teacher, tp.abstraction(e))} for e in episodes]


def _induce(teacher, mode, succ, fail, existing=(), max_new=3):
    prompt = tp.induction("heat", mode, succ, fail, list(existing), max_new=max_new,
                          success_counts={"heat": len(succ)}, failure_counts={"heat": len(fail)})
    return tp.check_induction(ask(teacher, prompt), max_new)


def test_induction_needs_support_and_skips_known_patterns():
    t = RuleTeacher(min_support=2)
    one = _items(t, [heat_win("egg", "desk"), heat_win("apple", "counter", ["go to garage"])])
    assert _induce(t, "extraction", one, []) == []   # two different chains, support 1 each
    two = _items(t, [heat_win("egg", "desk"), heat_win("apple", "counter"),
                     heat_win("bread", "desk", ["go to garage"])])
    [skill] = _induce(t, "extraction", two, [])
    assert skill["principle"] == "steps: take <A>, use heater, put <A> in <B>"
    assert skill["when_to_apply"] == "the task reads like: heat the <A> and put it in the <B>."
    assert skill["skill_id"] == "heat_steps" and skill["category"] == "heat"
    assert skill["title"] == "heat steps: take use heater put in"
    assert _induce(t, "extraction", two, [], existing=[{"title": "x", "principle":
                                                        skill["principle"], "when_to_apply": "",
                                                        "category": "heat"}]) == []


def test_contrastive_adds_what_only_failures_did_and_refinement_makes_pitfalls():
    t = RuleTeacher(min_support=2)
    succ = _items(t, [heat_win("egg", "desk"), heat_win("apple", "counter")])
    fail = _items(t, [episode(HEAT.format(o="egg", d="desk"), ["take egg", "use fan", "use fan",
                                                               "use stove"], False,
                              [True, False, False, False]),
                      episode(HEAT.format(o="egg", d="desk"), ["take egg", "use fan"], False,
                              [True, False])])
    [skill] = _induce(t, "contrastive", succ, fail)
    # "use fan" was rejected in both failures; "use stove" in one, below the support of 2.
    assert skill["principle"] == "steps: take <A>, use heater, put <A> in <B>; avoid: use fan"
    [pit] = _induce(t, "refinement", [], fail)
    assert pit["principle"] == "avoid: use fan" and pit["skill_id"] == "heat_pitfalls"
    assert "use stove" in _induce(RuleTeacher(min_support=1), "refinement", [], fail)[0][
        "principle"]


def test_attribution_and_reflexion_verdicts():
    t = RuleTeacher()
    skill = {"id": "s0001", "title": "heat", "principle": "steps: take <A>, use heater",
             "when_to_apply": "w", "stats": {"uses": 10, "successes": 2, "p_hat": 0.2,
                                             "consecutive_failures": 3}}
    followed = heat_win()
    assert ask(t, tp.attribution(skill, followed))["skill_relevance"] == "causal"
    failed = dict(followed, outcome="FAILURE")
    assert ask(t, tp.attribution(skill, failed))["skill_relevance"] == "harmful"
    other = episode(HEAT.format(o="egg", d="desk"), ["take egg", "use stove"], False)
    assert ask(t, tp.attribution(skill, other))["skill_relevance"] == "incidental"

    recent = _items(t, [heat_win("egg", "desk"), heat_win("apple", "counter")])
    verdict = tp.check_reflexion(ask(t, tp.reflexion(skill, [], recent)))
    assert verdict["verdict"] == "revise"
    assert verdict["revised_principle"] == "steps: take <A>, use heater, put <A> in <B>"
    same = dict(skill, principle="steps: take <A>, use heater, put <A> in <B>")
    assert ask(t, tp.reflexion(same, [], recent))["verdict"] == "keep"
    assert ask(t, tp.reflexion(skill, [], []))["verdict"] == "keep"   # no evidence to revise by


@pytest.mark.parametrize("check,obj,ok", [
    (tp.check_abstraction, {"contextual_description": "x", "refined_trajectory": [],
                            "strategic_guidelines": {"planning_pattern": None,
                                                     "mistakes_to_avoid": []}}, True),
    (tp.check_abstraction, {"contextual_description": "x"}, False),
    (tp.check_abstraction, ["x"], False),
    (lambda o: tp.check_induction(o, 2), [{"title": "t", "principle": "p",
                                            "when_to_apply": "w"}], True),
    (lambda o: tp.check_induction(o, 2), {"skills": []}, True),
    (lambda o: tp.check_induction(o, 2), [{"title": "t", "principle": ""}], False),
    (lambda o: tp.check_induction(o, 2), "text", False),
    (tp.check_attribution, {"skill_relevance": "causal"}, True),
    (tp.check_attribution, {"skill_relevance": "maybe"}, False),
    (tp.check_reflexion, {"verdict": "keep"}, True),
    (tp.check_reflexion, {"verdict": "revise"}, False),
    (tp.check_reflexion, {"verdict": "revise", "revised_when_to_apply": "w"}, True),
    (tp.check_reflexion, {"verdict": "drop"}, False),
])
def test_validators(check, obj, ok):
    if ok:
        check(obj)
    else:
        with pytest.raises(ValueError):
            check(obj)


def test_induction_keeps_at_most_max_new():
    skills = [{"title": f"t{i}", "principle": "p", "when_to_apply": "w"} for i in range(5)]
    assert len(tp.check_induction(skills, 2)) == 2
