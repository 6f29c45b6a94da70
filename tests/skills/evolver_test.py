"""The evolution step: pathway choice, deduplication, reflexion, ablations, failing teachers,
checkpoint state, and exact replay of a run's bank from its teacher cache."""

import json

import pytest

from skilljax.skills.evolution import EvolvingBank
from skilljax.skills.evolver import EvolutionConfig, Evolver, duplicate_reason
from skilljax.skills.retrieval import TfidfEmbedder
from skilljax.skills.rule_teacher import RuleTeacher
from skilljax.skills.teachers import ReplayTeacher, TeacherError

from tests.skills.rule_teacher_test import HEAT, episode, heat_win

COOL = "cool the {o} and put it in the {d}. The {o} is in the garage."


def cool_win(o="egg", d="desk"):
    return episode(COOL.format(o=o, d=d), [f"take {o}", "use freezer", "use fan",
                                           f"put {o} in {d}"], True, ttype="cool")


def heat_fail():
    return episode(HEAT.format(o="egg", d="desk"), ["take egg", "use fan"], False, [True, False])


def called(e, ids):
    return dict(e, called=list(ids))


def make(cfg=EvolutionConfig(), bank=None, teacher=None):
    return Evolver(bank or EvolvingBank(), teacher or RuleTeacher(), TfidfEmbedder(), cfg)


def test_duplicate_reasons():
    e = [{"title": "Heat steps", "principle": "steps: take <A>, use heater",
          "when_to_apply": "heat tasks"}]
    emb = TfidfEmbedder()
    assert "same title" in duplicate_reason(
        {"title": "heat  STEPS", "principle": "x", "when_to_apply": "y"}, e, emb, 0.8, 0.9)
    assert "word overlap" in duplicate_reason(
        {"title": "Heat steps now", "principle": "steps: take <A>, use heater",
         "when_to_apply": "z"}, e, None, 0.8, 0.9)   # Jaccard 5/6
    assert duplicate_reason({"title": "Cool steps", "principle": "use freezer then fan",
                             "when_to_apply": "cool tasks"}, e, emb, 0.8, 0.9) == ""
    # Semantic: nearly the same text under another title passes lexical, not embedding.
    near = {"title": "Warming routine", "principle": "steps: take <A>, use heater",
            "when_to_apply": "heat tasks"}
    assert duplicate_reason(near, e, None, 0.8, 0.9) == ""
    assert "similar to 'Heat steps'" in duplicate_reason(near, e, emb, 0.8, 0.5)


def test_pathways_routing_and_dedup_across_steps():
    ev = make(EvolutionConfig(types_per_induction=2))
    eps = [heat_win("egg", "desk"), heat_win("apple", "counter"), heat_fail(), heat_fail(),
           cool_win(), cool_win("apple", "counter")]
    ev.observe([called(e, []) for e in eps], step=1)
    m = ev.evolve(5)
    assert m["evolution_induced"] == 2 and m["evolution_abstracted"] == 6
    heat, cool = sorted(ev.bank.active(), key=lambda r: r.category != "heat")
    # heat had failures too: contrastive (its avoid list); cool only successes: extraction.
    assert heat.provenance[0] == {"event": "created", "pathway": "contrastive", "step": 5,
                                  "teacher": "rule"}
    assert heat.principle.endswith("; avoid: use fan")
    assert cool.provenance[0]["pathway"] == "extraction"
    assert cool.call_name == "cool_steps" and cool.category == "cool"
    # The same evidence again proposes nothing new (known patterns are not re-proposed).
    ev.observe([called(e, []) for e in eps], step=6)
    assert ev.evolve(10)["evolution_induced"] == 0
    assert len(ev.bank) == 2


def test_no_contrastive_uses_extraction_and_routing_takes_most_failures_first():
    ev = make(EvolutionConfig(contrastive=False, types_per_induction=1))
    ev.observe([called(e, []) for e in [heat_win("egg", "desk"), heat_win("apple", "counter"),
                                        heat_fail(), cool_win(), cool_win("apple", "counter")]],
               step=1)
    ev.evolve(5)
    [only] = ev.bank.active()
    assert only.category == "heat"                    # the type with failures was routed
    assert only.provenance[0]["pathway"] == "extraction" and "avoid" not in only.principle


def test_dedup_counts_a_near_copy_from_the_teacher():
    class Twice:
        name = "twice"

        def complete(self, prompt):
            if prompt.kind == "induction":
                return json.dumps([{"title": "Heat steps", "principle": "steps: a, b",
                                    "when_to_apply": "w"},
                                   {"title": "heat steps", "principle": "steps: a, b",
                                    "when_to_apply": "w"}])
            return RuleTeacher().complete(prompt)
    ev = make(teacher=Twice())
    ev.observe([called(heat_win(), [])], step=1)
    m = ev.evolve(5)
    assert (m["evolution_induced"], m["evolution_deduplicated"]) == (1, 1)
    assert ev.events[-1]["event"] == "deduplicated" and "same title" in ev.events[-1]["reason"]


def _weak_bank():
    bank = EvolvingBank()
    bank.add(title="Heat wrongly", principle="steps: take <A>, use stove",
             when_to_apply="heat tasks", category="heat")
    return bank


def test_reflexion_revises_the_flagged_skill_and_keeps_its_stats():
    ev = make(EvolutionConfig(review_after_uses=3, induction=False), bank=_weak_bank())
    failing = episode(HEAT.format(o="egg", d="desk"), ["take egg", "use stove"], False)
    ev.observe([called(failing, ["s0001"]) for _ in range(4)], step=1)
    ev.observe([called(heat_win("egg", "desk"), []), called(heat_win("apple", "counter"), [])], 2)
    r = ev.bank.records["s0001"]
    assert r.stats.uses == 4 and r.stats.p_hat == pytest.approx(0.5 * 0.9 ** 4)
    m = ev.evolve(5)
    assert (m["evolution_reviewed"], m["evolution_revised"]) == (1, 1)
    assert r.principle == "steps: take <A>, use heater, put <A> in <B>"
    assert r.revisions[0]["principle"] == "steps: take <A>, use stove"
    assert r.stats.uses == 4 and r.reviewed_at_uses == 4     # stats kept
    assert [p["event"] for p in r.provenance] == ["revised"]
    # Not reviewed again until it gains `review_after_uses` new uses.
    assert ev.evolve(10)["evolution_reviewed"] == 0


def test_no_reflexion_leaves_weak_skills_alone():
    ev = make(EvolutionConfig(review_after_uses=1, reflexion=False), bank=_weak_bank())
    ev.observe([called(heat_fail(), ["s0001"])] * 3 + [called(heat_win(), [])] * 2, step=1)
    assert ev.evolve(5)["evolution_reviewed"] == 0
    assert ev.bank.records["s0001"].principle == "steps: take <A>, use stove"


def test_malformed_teacher_answers_are_skipped_and_counted():
    class Broken:
        name = "broken"

        def complete(self, prompt):
            if prompt.kind == "induction":
                raise TeacherError("server down")
            return "not json at all"
    logged = []
    ev = Evolver(EvolvingBank(), Broken(), TfidfEmbedder(), EvolutionConfig(retries=1),
                 log=logged.append)
    ev.observe([called(heat_win(), []), called(heat_fail(), [])], step=1)
    m = ev.evolve(5)
    assert m["evolution_teacher_failures"] == 2 and m["evolution_induced"] == 0
    assert len(logged) == 2 and "abstraction" in logged[0]


def test_state_dict_round_trip():
    ev = make()
    ev.observe([called(heat_win("egg", "desk"), []), called(heat_win("apple", "counter"), [])], 1)
    ev.evolve(5)
    ev.observe([called(heat_fail(), ["s0001"])], step=6)
    other = make()
    other.load_state_dict(json.loads(json.dumps(ev.state_dict())))
    assert other.state_dict() == ev.state_dict()


def _run(teacher):
    """Three evolution steps over a fixed stream of episodes; the bank as JSON."""
    ev = make(EvolutionConfig(types_per_induction=2, review_after_uses=2), teacher=teacher)
    stream = [[heat_win("egg", "desk"), heat_win("apple", "counter"), heat_fail()],
              [cool_win(), cool_win("bread", "counter"), heat_fail()],
              [heat_win("bread", "desk", ["go to garage"])]]
    for k, eps in enumerate(stream, 1):
        ids = [r.id for r in ev.bank.active()]
        ev.observe([called(e, ids[:1]) for e in eps], step=5 * k - 1)
        ev.evolve(5 * k)
    return json.dumps(ev.bank.to_json(), sort_keys=True)


def test_replay_teacher_reproduces_the_bank_exactly(tmp_path):
    cache = tmp_path / "teacher_cache.jsonl"
    recorded = _run(ReplayTeacher(cache, RuleTeacher()))
    assert cache.read_text().count("\n") > 5
    replayed = _run(ReplayTeacher(cache))   # no inner teacher: every answer from the cache
    assert replayed == recorded
    with pytest.raises(TeacherError, match="did not"):
        Evolver(EvolvingBank(), ReplayTeacher(cache), None, EvolutionConfig()).teacher.complete(
            "another prompt")


def test_episodes_from_marks_actions_that_did_nothing():
    from skilljax.envs.base import Task
    from skilljax.rl.rollout import Trajectory
    from skilljax.skills.evolver import episodes_from
    t = Trajectory(Task("t0", "heat", "train", {}), 0, 0, actions=["take egg", "use fan",
                                                                   "use heater"],
                   env_valid=[True, True, True], won=True, goal="heat the egg.",
                   observations=["You take the egg.", "You walk to the garage. Nothing happens.",
                                 "You use the heater on the egg."],
                   calls=[{"step": 1, "names": ["s0001"], "skill_id": "s0001"}])
    [e] = episodes_from([t])
    assert [s["applied"] for s in e["steps"]] == [True, False, True]
    assert [s["skill"] for s in e["steps"]] == ["", "s0001", ""]
    assert (e["outcome"], e["called"], e["task"]) == ("SUCCESS", ["s0001"], "heat the egg.")
