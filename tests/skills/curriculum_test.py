"""SKILL0 curriculum: eq. 6 budgets, Filter → Rank → Select, stages, updates, ablations, resume."""

import random

import pytest

from skilljax.skills.bank import GENERAL, SkillBank
from skilljax.skills.curriculum import (Curriculum, CurriculumConfig, budget_schedule,
                                        file_deltas, select_skills)

CHORES = SkillBank.for_env("chores")   # 6 files; heat and cool share "temperature"
ALL = ("general_skills", "cleaning", "temperature", "lighting", "tidying", "cooking")


# ------------------------------------------------------------------ eq. 6

@pytest.mark.parametrize("n, stages, expected", [
    (6, 3, [6, 3, 0]),        # paper §4.4: ALFWorld
    (5, 3, [5, 3, 0]),        # paper §4.4: Search-QA (ceil(5·1/2) = 3)
    (7, 3, [7, 4, 0]),        # ceil(3.5) = 4
    (6, 4, [6, 4, 2, 0]),     # ceil(6·2/3) = 4, ceil(6·1/3) = 2
    (5, 4, [5, 4, 2, 0]),     # ceil(10/3) = 4, ceil(5/3) = 2
    (4, 5, [4, 3, 2, 1, 0]),
    (3, 2, [3, 0]),
    (0, 3, [0, 0, 0]),
])
def test_budget_schedule_eq6(n, stages, expected):
    assert budget_schedule(n, stages) == expected


def test_budget_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="num_stages >= 2"):
        budget_schedule(6, 1)
    with pytest.raises(ValueError, match="num_files must be >= 0"):
        budget_schedule(-1, 3)


def test_packaged_banks_give_the_papers_budgets():
    assert budget_schedule(len(SkillBank.for_env("alfworld")), 3) == [6, 3, 0]
    assert budget_schedule(len(SkillBank.for_env("search_qa")), 3) == [5, 3, 0]


# ------------------------------------------------------------------ filter, rank, select

D = {"general_skills": -0.5, "a": 0.2, "b": 0.0, "c": -0.1, "d": 0.2, "e": 0.4}


def test_select_filter_rank_and_general_slot():
    assert select_skills(D, 3) == ["general_skills", "e", "a"]          # a, d tie → a by name
    assert select_skills(D, 4) == ["general_skills", "e", "a", "d"]
    assert select_skills(D, 10) == ["general_skills", "e", "a", "d", "b"]  # Δ = 0 kept, c dropped
    assert select_skills(D, 10, strict=True) == ["general_skills", "e", "a", "d"]
    assert select_skills(D, 1) == ["general_skills"]
    assert select_skills(D, 0) == []
    assert select_skills(dict(reversed(D.items())), 4) == select_skills(D, 4)


def test_select_without_keep_general_ranks_it_like_any_file():
    assert select_skills(D, 3, keep_general=False) == ["e", "a", "d"]   # general Δ < 0: filtered
    assert select_skills({**D, GENERAL: 0.3}, 3, keep_general=False) == ["e", GENERAL, "a"]
    no_general = {k: v for k, v in D.items() if k != GENERAL}
    assert select_skills(no_general, 2) == ["e", "a"]


def test_select_ablation_switches():
    assert select_skills(D, 10, filter=False) == ["general_skills", "e", "a", "d", "b", "c"]
    assert select_skills(D, 3, filter=False, keep_general=False) == ["e", "a", "d"]
    picks = [tuple(select_skills(D, 3, rng=random.Random(s))) for s in range(20)]
    assert picks == [tuple(select_skills(D, 3, rng=random.Random(s))) for s in range(20)]
    assert all(p[0] == GENERAL and set(p[1:]) <= {"a", "b", "d", "e"} for p in picks)
    assert len(set(picks)) > 1                                          # not the Δ order


def test_select_rejects_bad_input():
    with pytest.raises(ValueError, match="budget must be >= 0"):
        select_skills(D, -1)
    with pytest.raises(ValueError, match="must be a number"):
        select_skills({"a": float("nan")}, 1)


# ------------------------------------------------------------------ stages

def test_stages_follow_the_released_schedule_clamped_at_step_0():
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=180, validate_every=10))
    assert cur.budgets == (6, 3, 0)
    steps = [0, 10, 60, 70, 120, 130, 180]
    assert [cur.stage(s) for s in steps] == [1, 1, 1, 2, 2, 3, 3]
    assert [cur.budget(s) for s in steps] == [6, 6, 6, 3, 3, 0, 0]
    # Unclamped, step 0 lands on stage index -1, i.e. the last budget, 0 (released bug, §3.2).
    bug = Curriculum(CHORES, CurriculumConfig(total_steps=180, clamp_start=False))
    assert (bug.stage(0), bug.budget(0)) == (0, 0)
    assert [bug.stage(s) for s in steps[1:]] == [1, 1, 2, 2, 3, 3]


def test_due_and_uneven_stages():
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=25, validate_every=10))
    assert [s for s in range(26) if cur.due(s)] == [10, 20, 25]
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=25, validate_every=10,
                                              validate_at_start=True))
    assert [s for s in range(26) if cur.due(s)] == [0, 10, 20, 25]
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=100, validate_every=1))
    stages = [cur.stage(s) for s in range(101)]
    assert stages == sorted(stages) and [stages.count(s) for s in (1, 2, 3)] == [35, 33, 33]


# ------------------------------------------------------------------ updates

# Step 10: Δ per type clean .6, heat .6, cool -.2, light 0, place -.2, prepare .3.
WITH_10 = dict(clean=.8, heat=.9, cool=.5, light=.6, place=.7, prepare=.4)
WITHOUT_10 = dict(clean=.2, heat=.3, cool=.7, light=.6, place=.9, prepare=.1)
# Step 20: Δ clean 0, heat .25, cool .25, light .25, place 0, prepare .5.
WITH_20 = dict(clean=.5, heat=.5, cool=.5, light=.5, place=.5, prepare=.5)
WITHOUT_20 = dict(clean=.5, heat=.25, cool=.25, light=.25, place=.5, prepare=0.)


def test_file_deltas_average_over_task_types():
    deltas = file_deltas(CHORES, WITH_10, WITHOUT_10)
    assert deltas == pytest.approx({
        "general_skills": (.6 + .6 - .2 + 0 - .2 + .3) / 6, "cleaning": .6,
        "temperature": (.6 - .2) / 2, "lighting": 0, "tidying": -.2, "cooking": .3})
    assert deltas["lighting"] == 0   # exactly: 0 is kept by the Δ ≥ 0 filter
    # Files whose task types were not measured get no Δ (they are no candidates).
    assert file_deltas(CHORES, {"heat": .5}, {"heat": .25}) == {"general_skills": .25,
                                                                "temperature": .25}
    with pytest.raises(ValueError, match="different task types"):
        file_deltas(CHORES, {"heat": .5}, {"cool": .5})
    with pytest.raises(ValueError, match="does not map: \\['random'\\]"):
        file_deltas(CHORES, {"random": .5}, {"random": .5})
    with pytest.raises(ValueError, match="No task type was measured"):
        file_deltas(CHORES, {}, {})


def test_update_sequence_by_hand():
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=30, validate_every=10))
    assert cur.budgets == (6, 3, 0) and cur.active == ALL
    # Stage 1, budget 6: tidying (Δ -.2) is filtered; lighting (Δ 0) stays.
    assert cur.update(10, WITH_10, WITHOUT_10) == (
        "general_skills", "cleaning", "cooking", "temperature", "lighting")
    # Stage 2, budget 3: cooking .5, then lighting and temperature tie at .25 → by name.
    assert cur.update(20, WITH_20, WITHOUT_20) == ("general_skills", "cooking", "lighting")
    assert cur.context("clean") == CHORES.context("clean", [GENERAL])
    assert cur.contexts()["prepare"] == CHORES.context("prepare")
    # Stage 3, budget 0: everything goes, general included.
    assert cur.update(30, WITH_20, WITHOUT_20) == ()
    assert cur.context("prepare") == ""
    assert [(h["step"], h["stage"], h["budget"]) for h in cur.history] == [
        (10, 1, 6), (20, 2, 3), (30, 3, 0)]
    assert cur.history[1]["deltas"] == {"general_skills": pytest.approx(1.25 / 6), "cleaning": 0,
                                        "temperature": .25, "lighting": .25, "tidying": 0,
                                        "cooking": .5}
    assert cur.history[1]["with_skills"] == WITH_20 and cur.history[2]["active"] == []


def test_step0_update_keeps_skills_unless_the_bug_is_asked_for():
    cfg = dict(total_steps=30, validate_every=10, validate_at_start=True)
    cur = Curriculum(CHORES, CurriculumConfig(**cfg))
    assert cur.due(0) and cur.update(0, WITH_10, WITHOUT_10) == (
        "general_skills", "cleaning", "cooking", "temperature", "lighting")
    bug = Curriculum(CHORES, CurriculumConfig(**cfg, clamp_start=False))
    assert bug.update(0, WITH_10, WITHOUT_10) == ()


# ------------------------------------------------------------------ ablations

def run(**overrides):
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=30, validate_every=10, **overrides))
    start = cur.active
    return [start] + [cur.update(s, w, wo) for s, w, wo in (
        (10, WITH_10, WITHOUT_10), (20, WITH_20, WITHOUT_20), (30, WITH_20, WITHOUT_20))]


def test_ablation_modes():
    assert run(fixed_full=True) == [ALL] * 4
    assert run(filter=False)[1] == ALL[:1] + ("cleaning", "cooking", "temperature", "lighting",
                                              "tidying")
    assert run(strict=True)[1] == ("general_skills", "cleaning", "cooking", "temperature")
    # Fixed budgets: the same Δ-driven selection under a constant cap.
    assert run(budgets=(3, 3, 3)) == [ALL, ("general_skills", "cleaning", "cooking"),
                                      ("general_skills", "cooking", "lighting"),
                                      ("general_skills", "cooking", "lighting")]
    assert run(budgets=(6, 6, 6))[1:] == [("general_skills", "cleaning", "cooking", "temperature",
                                           "lighting")] + [
        ("general_skills", "cooking", "lighting", "temperature", "cleaning", "tidying")] * 2
    assert run(budgets=(0, 0, 0)) == [()] * 4
    with pytest.raises(ValueError, match="budgets must be"):
        CurriculumConfig(total_steps=30, budgets=(3, -1))
    with pytest.raises(ValueError, match="rank must be"):
        CurriculumConfig(total_steps=30, rank="best")


def test_random_rank_is_seeded_and_respects_filter_and_budget():
    runs = {seed: run(rank="random", seed=seed) for seed in range(8)}
    assert runs[0] == run(rank="random", seed=0)
    assert len({tuple(r) for r in runs.values()}) > 1
    for r in runs.values():
        assert r[1][0] == GENERAL and len(r[1]) == 5 and "tidying" not in r[1]   # Δ < 0 filtered
        assert r[2][0] == GENERAL and len(r[2]) == 3 and r[3] == ()


# ------------------------------------------------------------------ checkpoints

def test_state_round_trip_through_checkpointer(tmp_path):
    from skilljax import models
    from skilljax.rl.checkpoint import Checkpointer

    cfg = CurriculumConfig(total_steps=30, validate_every=10, rank="random", seed=3)
    cur = Curriculum(CHORES, cfg)
    cur.update(10, WITH_10, WITHOUT_10)
    _, model = models.load("tiny", num_layers=1, seed=0)
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(10, model, host_state={"curriculum": cur.state_dict()})
    ckpt.close()

    resumed = Curriculum(CHORES, cfg)
    _, model = models.load("tiny", num_layers=1, seed=1)
    step, _, host = Checkpointer(tmp_path).restore(model)
    resumed.load_state_dict(host["curriculum"])
    assert step == 10 and resumed.active == cur.active and resumed.history == cur.history
    assert (resumed.update(20, WITH_20, WITHOUT_20) == cur.update(20, WITH_20, WITHOUT_20))
    assert resumed.state_dict() == cur.state_dict()


def test_load_state_dict_checks_the_configuration():
    cur = Curriculum(CHORES, CurriculumConfig(total_steps=30))
    state = cur.state_dict()
    with pytest.raises(ValueError, match="budgets"):
        Curriculum(CHORES, CurriculumConfig(total_steps=30, budgets=(3, 3, 3))).load_state_dict(state)
    with pytest.raises(ValueError, match="not in the bank"):
        cur.load_state_dict({**state, "active": ["gone"]})


def test_update_without_the_with_skills_pass_at_budget_zero():
    """Algorithm 1 skips the with-skills pass when M(s) = 0: no Δ, nothing kept."""
    bank = SkillBank.for_env("chores")
    cur = Curriculum(bank, CurriculumConfig(total_steps=30, budgets=(6, 3, 0)))
    assert cur.needs_with_pass(10) and cur.needs_with_pass(20) and not cur.needs_with_pass(30)
    rates = {t: 0.5 for t in bank.task_types}
    with pytest.raises(ValueError, match="needs the with-skills pass"):
        cur.update(20, None, rates)
    assert cur.update(30, None, rates) == ()
    assert cur.history[-1]["deltas"] == {} and cur.history[-1]["with_skills"] is None
    full = Curriculum(bank, CurriculumConfig(total_steps=30, budgets=(6, 3, 0), fixed_full=True))
    assert full.needs_with_pass(30)  # Fixed Full keeps every file and still logs Δ


def test_unclamped_step_zero_uses_the_last_budget_for_any_run_length():
    bank = SkillBank.for_env("chores")
    for total in (2, 3, 180):
        cur = Curriculum(bank, CurriculumConfig(total_steps=total, budgets=(6, 3, 0),
                                                clamp_start=False))
        assert cur.stage(0) == 0 and cur.budget(0) == 0
