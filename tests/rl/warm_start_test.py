"""SkillForge warm-start catalogs: the task's own rule-induced skill, distractors, call names."""

from skilljax.rl.warm_start import TaskCatalogs
from skilljax.skills.evolution import CatalogConfig
from skilljax.skills.retrieval import TfidfEmbedder
from tests.skills.rule_teacher_test import episode

VERBS = ("coat", "seal", "tune", "press")


def _episodes():
    return [episode(f"{v} the egg and put it in the desk.", ["take egg", f"use {d}",
                                                            "put egg in desk"], True, ttype="random")
            for v, d in zip(VERBS, ("fan", "lamp", "sink", "soap"))]


def test_catalogs_hold_the_tasks_own_skill_and_the_expert_calls_it():
    cats = TaskCatalogs(_episodes(), TfidfEmbedder(), CatalogConfig(instruction=""), distractors=0)
    task = "seal the egg and put it in the desk."
    assert cats.call_for(task) == "seal_steps"
    assert cats.text(task, "random").splitlines() == [
        "Skill catalog (task):", "- seal_steps: the task reads like: seal the <A> and put it in "
        "the <B>."]
    res = cats.respond(task, "random", "<action>take egg</action><skill>seal_steps</skill>")
    assert "principle: steps: take <A>, use lamp, put <A> in <B>" in res.feedback
    assert cats.text("an unknown task", "random") == "" and cats.call_for("x") is None
    assert cats.respond("x", "random", "<action>a</action><skill>s</skill>").names == ["s"]


def test_distractors_and_names_by_id():
    cats = TaskCatalogs(_episodes(), TfidfEmbedder(), CatalogConfig(instruction=""),
                        distractors=2, naming="id")
    task = "coat the egg and put it in the desk."
    lines = cats.text(task, "random").splitlines()[1:]
    assert len(lines) == 3 and all(line.startswith("- s00") for line in lines)
    own = cats.call_for(task)
    assert own.startswith("s00") and 1 <= int(own[1:]) <= 64
    assert any(line.startswith(f"- {own}: the task reads like: coat") for line in lines)
