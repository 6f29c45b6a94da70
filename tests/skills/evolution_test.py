"""SkillForge records: EMA and conf by hand, evidence per episode, tag parsing, catalog retrieval and
call resolution, bank JSON."""

import json

import pytest

from skilljax.skills.bank import SkillBank
from skilljax.skills.evolution import (Catalog, CatalogConfig, EvolvingBank, SkillRecord, call_name,
                                       confidence, ema, split_calls)
from skilljax.skills.retrieval import TfidfEmbedder


def test_ema_and_confidence_by_hand():
    assert ema(0.5, True) == pytest.approx(0.55)          # 0.1·1 + 0.9·0.5
    assert ema(0.5, False) == pytest.approx(0.45)
    assert ema(0.2, 1, alpha=0.5) == pytest.approx(0.6)
    # conf = (1 − p)(1 − 0.5^(n/h)): n = h halves the evidence factor.
    assert confidence(0.3, 20) == pytest.approx(0.7 * 0.5)
    assert confidence(0.3, 40) == pytest.approx(0.7 * 0.75)
    assert confidence(0.3, 10, half_life=10) == pytest.approx(0.35)
    assert confidence(1.0, 100) == 0.0 and confidence(0.0, 0) == 0.0


def _bank():
    b = EvolvingBank()
    b.add(title="Heat steps", principle="steps: take <A>, use heater, put <A> in <B>",
          when_to_apply="the task reads like: heat the <A> and put it in the <B>.",
          category="heat", name="heat_steps")
    b.add(title="Cool steps", principle="steps: take <A>, use freezer, use fan",
          when_to_apply="the task reads like: cool the <A> and put it in the <B>.",
          category="cool", name="cool_steps")
    b.add(title="Check what you hold", principle="look at your hands before using a device",
          when_to_apply="any task with devices", category="general")
    return b


def test_evidence_is_one_update_per_episode_and_skill():
    b = _bank()
    s1, s2 = "s0001", "s0002"
    # Episode 1 calls s1 three times and wins; episode 2 calls s1 and s2 and loses.
    n = b.record_outcomes([([s1, s1, s1], True), ([s2, s1], False)], step=7)
    assert n == 3
    st = b.records[s1].stats
    assert (st.uses, st.successes, st.calls, st.last_used_step) == (2, 1, 4, 7)
    assert st.p_hat == pytest.approx(0.9 * (0.1 + 0.9 * 0.5))   # 0.5 → 0.55 → 0.495
    assert st.consecutive_failures == 1
    assert b.records[s2].stats.p_hat == pytest.approx(0.45)
    b.record_outcomes([([s2], False)], step=8)
    assert b.records[s2].stats.consecutive_failures == 2
    assert b.record_outcomes([(["nope"], True)], step=9) == 0   # a skill no longer in the bank


@pytest.mark.parametrize("text,clean,names,problems", [
    ("<action>take egg</action><skill>heat_steps</skill>", "<action>take egg</action>",
     ["heat_steps"], []),
    ("<skill> heat_steps </skill><action>take egg</action>", "<action>take egg</action>",
     ["heat_steps"], []),
    ("<action>take egg <skill>heat_steps</skill></action>", "<action>take egg </action>",
     ["heat_steps"], ["skill tag inside the action"]),
    ("<action>go</action><skill>a</skill><skill>b</skill>", "<action>go</action>", ["a", "b"], []),
    ("<action>go</action><skill>heat_steps", "<action>go</action>heat_steps", [],
     ["unclosed skill tag"]),
    ("<action>go</action><skill></skill>", "<action>go</action>", [], ["empty skill tag"]),
    ("<action>go</action>", "<action>go</action>", [], []),
])
def test_split_calls(text, clean, names, problems):
    assert split_calls(text) == (clean, names, problems)


def test_catalog_ranks_by_similarity_and_resolves_calls():
    b = _bank()
    b.add(title="Heat pitfalls", principle="avoid: use fan",
          when_to_apply="any heat task with a fan nearby", category="heat")
    cat = Catalog(b, TfidfEmbedder(), CatalogConfig(general_k=1, specific_k=2, instruction=""))
    task = "heat the egg and put it in the counter. The egg is in the kitchen."
    general, specific = cat.entries(task, "heat")
    assert [r.call_name for r in general] == ["check_what_you_hold"]
    # Both heat skills, the one whose trigger shares the task's words first; no cool skill.
    assert [r.call_name for r in specific] == ["heat_steps", "heat_pitfalls"]
    text = cat.text(task, "heat")
    assert text.splitlines() == [
        "Skill catalog (general):", "- check_what_you_hold: any task with devices",
        "Skill catalog (task):",
        "- heat_steps: the task reads like: heat the <A> and put it in the <B>.",
        "- heat_pitfalls: any heat task with a fan nearby"]
    assert cat.text(task, "clean") .startswith("Skill catalog (general):")

    ok = cat.respond(task, "heat", "<action>take egg</action><skill>heat_steps</skill>")
    assert ok.skill_id == "s0001" and ok.problem == ""
    assert ok.feedback.startswith("Skill output: call_name: heat_steps | title: Heat steps")
    assert "principle: steps: take <A>, use heater, put <A> in <B>" in ok.feedback
    # A skill of another type is not in this task's catalog: reported, not resolved.
    other = cat.respond(task, "heat", "<action>x</action><skill>cool_steps</skill>")
    assert other.skill_id is None and "Unknown skill 'cool_steps'" in other.feedback
    many = cat.respond(task, "heat", "<action>x</action><skill>heat_steps</skill>"
                                     "<skill>heat_pitfalls</skill>")
    assert many.skill_id == "s0001" and "ignored: heat_pitfalls" in many.feedback
    none = cat.respond(task, "heat", "<action>x</action>")
    assert none.feedback == "" and none.skill_id is None


def test_catalog_is_a_snapshot_of_the_bank():
    b = _bank()
    cat = Catalog(b, TfidfEmbedder())
    b.records["s0001"].principle = "changed"
    b.add(title="New", principle="p", when_to_apply="w", category="heat")
    _, specific = cat.entries("heat the egg", "heat")
    assert [r.principle for r in specific] == ["steps: take <A>, use heater, put <A> in <B>"]


def test_bank_json_round_trip_and_unique_names(tmp_path):
    b = _bank()
    b.record_outcomes([(["s0002"], True)], step=3)
    again = b.add(title="Heat steps!", principle="x", when_to_apply="y", category="heat",
                  name="heat_steps")
    assert again.call_name == "heat_steps_2" and again.id == "s0004"
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(b.to_json()))
    loaded = EvolvingBank.load(path)
    assert loaded.to_json() == b.to_json()
    assert loaded.add(title="t", principle="p", when_to_apply="w", category="heat").id == "s0005"
    # A bare list of hand-written records (ids continue after the largest).
    path.write_text(json.dumps([{"id": "s0009", "title": "A b", "principle": "p",
                                 "when_to_apply": "w", "category": "heat"}]))
    bare = EvolvingBank.load(path)
    assert bare.records["s0009"].call_name == "a_b" and bare.next_id == 10
    path.write_text("[{\"title\": \"no id\"}]")
    with pytest.raises(ValueError, match="not a skill bank"):
        EvolvingBank.load(path)
    with pytest.raises(ValueError, match="call name"):
        EvolvingBank([SkillRecord("a", "x", "t", "p", "w"), SkillRecord("b", "x", "t", "p", "w")])
    assert call_name("Open Then Heat!") == "open_then_heat"


def test_records_from_the_chores_markdown_bank():
    b = EvolvingBank.from_skill_bank(SkillBank.for_env("chores"))
    cats = sorted(r.category for r in b.active())
    assert cats == ["clean", "cool", "general", "heat", "light", "place", "prepare"]
    heat = next(r for r in b.active() if r.category == "heat")
    assert heat.principle.startswith("To heat an item: take it, use heater")
    assert heat.provenance[0]["pathway"] == "hand-written"


def test_packaged_skillforge_bank_loads():
    import os
    from skilljax.skills.bank import PACKAGED_DIR
    b = EvolvingBank.load(os.path.join(PACKAGED_DIR, "chores", "skillforge_bank.json"))
    assert sorted(r.category for r in b.active()) == ["clean", "cool", "heat", "light", "place",
                                                      "prepare"]


def test_call_by_id():
    b = EvolvingBank(naming="id")
    r = b.add(title="Heat steps", principle="p", when_to_apply="w", category="heat",
              name="heat_steps")
    assert r.call_name == "s0001"
    loaded = EvolvingBank.from_json(json.loads(json.dumps(b.to_json())))
    assert loaded.naming == "id" and loaded.add(title="x", principle="p", when_to_apply="w",
                                                category="heat").call_name == "s0002"
    hand = _bank().call_by_id()
    assert [r.call_name for r in hand.active()] == ["s0001", "s0002", "s0003"]
    with pytest.raises(ValueError, match="'title' or 'id'"):
        EvolvingBank(naming="number")
