"""Skill bank: section parsing, mapping errors, context strings, and every packaged bank."""

import json
import re

import pytest

from skilljax.envs.chores import BENCHMARK, procedure_text
from skilljax.envs.countdown import Countdown
from skilljax.envs.textworld_cooking import DIFFICULTIES
from skilljax.skills.bank import GENERAL, SkillBank, SkillBankError, parse_sections

EXPECTED_TYPES = {
    "chores": tuple(BENCHMARK),
    "countdown": Countdown.task_types(),
    "textworld_cooking": DIFFICULTIES,
    "alfworld": ("pick_and_place", "pick_two_obj_and_place", "look_at_obj_in_light",
                 "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
                 "pick_clean_then_place_in_recep"),
    "search_qa": ("direct", "attribute", "comparison", "multihop"),
}


def write_bank(tmp_path, files, task_to_skill, **extra):
    mapping = {"skill_files": {name: f"{name}.md" for name in files},
               "task_to_skill": task_to_skill, **extra}
    (tmp_path / "skill_mapping.json").write_text(json.dumps(mapping))
    for name, text in files.items():
        (tmp_path / f"{name}.md").write_text(text)
    return tmp_path


# A small bank with a file shared by two task types (one shared, one per-type section).
FILES = {
    "shared": "### BOTH ###\nfor x and y\n\n### TASK: x ###\nonly x\n### TASK: y ###\nonly y\n",
    "zeta": "### Z ###\nfor z\n",
    GENERAL: "A note for humans.\n### GENERAL SKILLS ###\n  general one  \n\n",
}
MAPPING = {"x": "shared", "y": "shared", "z": ["zeta", "shared"]}


def test_parse_sections():
    text = ("ignored preamble\n### A ###\nfirst\n### Not a header\nstill first\n\n"
            "###  B  ###   \nsecond\n")
    assert parse_sections(text) == {"A": "first\n### Not a header\nstill first", "B": "second"}
    with pytest.raises(SkillBankError, match="no section headers"):
        parse_sections("just text\n")
    with pytest.raises(SkillBankError, match="'A' appears twice"):
        parse_sections("### A ###\none\n### A ###\ntwo\n")
    with pytest.raises(SkillBankError, match="'B' is empty"):
        parse_sections("### A ###\none\n### B ###\n\n")


def test_load_and_queries(tmp_path):
    bank = SkillBank.load(write_bank(tmp_path, FILES, MAPPING))
    assert bank.file_names == (GENERAL, "shared", "zeta")   # general first, then mapping order
    assert len(bank) == 3 and bank.task_types == ("x", "y", "z")
    assert bank.files_for("x") == (GENERAL, "shared")
    assert bank.files_for("z") == (GENERAL, "zeta", "shared")
    assert bank.task_types_of("shared") == ("x", "y", "z")
    assert bank.task_types_of("zeta") == ("z",)
    assert bank.task_types_of(GENERAL) == ("x", "y", "z")
    assert bank.sections(GENERAL) == {"GENERAL SKILLS": "general one"}


def test_context_merges_general_then_task_sections(tmp_path):
    bank = SkillBank.load(write_bank(tmp_path, FILES, MAPPING))
    assert bank.context("x") == "general one\n\nfor x and y\n\nonly x"
    assert bank.context("y") == "general one\n\nfor x and y\n\nonly y"
    assert bank.context("z") == "general one\n\nfor z\n\nfor x and y"
    assert bank.context("x", [GENERAL]) == "general one"
    assert bank.context("x", ["shared"]) == "for x and y\n\nonly x"
    assert bank.context("z", ["zeta", GENERAL]) == "general one\n\nfor z"   # bank order, not ours
    assert bank.context("x", ["zeta"]) == ""
    assert bank.context("x", []) == ""                                    # skills off
    assert bank.contexts([GENERAL]) == {"x": "general one", "y": "general one", "z": "general one"}
    with pytest.raises(SkillBankError, match="Unknown skill file 'nope'"):
        bank.context("x", ["nope"])
    with pytest.raises(SkillBankError, match="Task type 'w' has no skill mapping"):
        bank.context("w")


def test_bank_without_general_file():
    bank = SkillBank({"a": {"TASK: t": "do a"}}, {"t": "a"})
    assert bank.file_names == ("a",) and bank.files_for("t") == ("a",)
    assert bank.context("t") == "do a"


@pytest.mark.parametrize("files, mapping, error, match", [
    ({"a": "### A ###\nx\n", "b": "### A ###\ny\n"}, {"t": "a", "u": "b"}, SkillBankError,
     "'A' is in both 'a' and 'b'"),
    ({"a": "### A ###\nx\n"}, {"t": "b"}, SkillBankError, "names 'b', which is not in skill_files"),
    ({"a": "### A ###\nx\n", GENERAL: "### G ###\ng\n"}, {"t": GENERAL}, SkillBankError,
     "must not be mapped"),
    ({"a": "### A ###\nx\n", "b": "### B ###\ny\n"}, {"t": "a"}, SkillBankError,
     "'b'.* is used by no task type"),
    ({"a": "### TASK: u ###\nx\n"}, {"t": "a"}, SkillBankError,
     "'TASK: u' of 'a'.* names neither a task type that uses 'a'"),
    ({"a": "### A ###\nx\n"}, {"t": []}, SkillBankError, "non-empty list"),
    ({"a": "no header\n"}, {"t": "a"}, SkillBankError, "no section headers"),
])
def test_mapping_errors(tmp_path, files, mapping, error, match):
    with pytest.raises(error, match=match):
        SkillBank.load(write_bank(tmp_path, files, mapping))


def test_missing_files_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="No skill_mapping.json in"):
        SkillBank.load(tmp_path)
    write_bank(tmp_path, {"a": "### A ###\nx\n"}, {"t": "a"})
    (tmp_path / "a.md").unlink()
    with pytest.raises(FileNotFoundError, match="Skill file 'a' → 'a.md'.*does not exist"):
        SkillBank.load(tmp_path)
    (tmp_path / "skill_mapping.json").write_text("{not json")
    with pytest.raises(SkillBankError, match="not valid JSON"):
        SkillBank.load(tmp_path)
    (tmp_path / "skill_mapping.json").write_text(json.dumps({"skill_files": {}}))
    with pytest.raises(SkillBankError, match="'skill_files' and 'task_to_skill'"):
        SkillBank.load(tmp_path)
    write_bank(tmp_path, {"a": "### A ###\nx\n"}, {"t": "a"}, skill_file="typo")
    with pytest.raises(SkillBankError, match="unknown keys \\['skill_file'\\]"):
        SkillBank.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="No packaged skill bank for env 'nope'"):
        SkillBank.for_env("nope")


# ------------------------------------------------------------------ packaged banks

def test_every_env_has_a_packaged_bank():
    assert SkillBank.packaged_envs() == sorted(EXPECTED_TYPES)


@pytest.mark.parametrize("env", sorted(EXPECTED_TYPES))
def test_packaged_bank(env):
    bank = SkillBank.for_env(env)
    assert bank.task_types == EXPECTED_TYPES[env]
    assert bank.file_names[0] == GENERAL
    general = "\n\n".join(bank.sections(GENERAL).values())
    for ttype in bank.task_types:
        context = bank.context(ttype)
        assert context.startswith(general + "\n\n") and len(context) > len(general) + 50
        assert bank.context(ttype, []) == ""
        assert bank.context(ttype, [GENERAL]) == general
    if env != "chores":   # numbered skills, each with a title and when to apply it
        for name in bank.file_names:
            for key, body in bank.sections(name).items():
                items = re.findall(r"^\d+\. ([^:\n]+): (.+)$", body, re.MULTILINE)
                assert items, (name, key)
                assert all("Use it " in rest for _, rest in items), (name, key)


def test_chores_contexts_hold_exactly_their_procedure():
    bank = SkillBank.for_env("chores")
    assert len(bank) >= 4   # so budgets such as [N, N/2, 0] mean something
    texts = {}
    for ttype, spec in BENCHMARK.items():
        dest = None if ttype == "light" else "home" if ttype == "place" else "counter"
        texts[ttype] = procedure_text(spec["verb"], spec["steps"], dest)
    for ttype in BENCHMARK:
        context = bank.context(ttype)
        assert texts[ttype] in context
        assert [t for t in BENCHMARK if texts[t] in context] == [ttype]
        assert context.count("To ") == 1   # one procedure sentence: nothing to confuse it with
        section = next(body for name in bank.files_for(ttype)[1:]
                       for key, body in bank.sections(name).items() if key == f"TASK: {ttype}")
        # One sentence: its verb says when to apply it, its steps are the principle (a tiny
        # policy reads these; extra title lines slowed its warm start, see issue 7 notes).
        assert section == texts[ttype]
    # Heat and cool share a file, so a file's Δ averages several task types.
    assert bank.task_types_of("temperature") == ("heat", "cool")


def test_released_bank_format(tmp_path):
    """The released SKILL0 banks key task sections by file (`TASK: heat` in heat.md serves the
    type pick_heat_then_place_in_recep), and pick_two reads the `TASK: pick_and_place` section."""
    files = {
        GENERAL: "### GENERAL SKILLS ###\nHere are some useful general strategies.\n",
        "pick_and_place": "### TASK: pick_and_place ###\nFor this pick task: grab when seen.\n",
        "heat": "### TASK: heat ###\nFor this heat task: open then heat.\n",
        "look_at_obj_in_light": "### TASK: look_at_obj_in_light ###\nSwitch the lamp on.\n",
    }
    mapping = {"pick_and_place": "pick_and_place", "pick_two_obj_and_place": "pick_and_place",
               "pick_heat_then_place_in_recep": "heat",
               "look_at_obj_in_light": "look_at_obj_in_light"}
    bank = SkillBank.load(write_bank(tmp_path, files, mapping))
    general = "Here are some useful general strategies."
    assert bank.context("pick_heat_then_place_in_recep") == (
        f"{general}\n\nFor this heat task: open then heat.")
    pick = f"{general}\n\nFor this pick task: grab when seen."
    assert bank.context("pick_and_place") == pick
    assert bank.context("pick_two_obj_and_place") == pick
    assert bank.context("look_at_obj_in_light") == f"{general}\n\nSwitch the lamp on."
    assert bank.context("pick_heat_then_place_in_recep", [GENERAL]) == general


def test_own_type_section_wins_over_the_file_section(tmp_path):
    files = {"pick_and_place": "### TASK: pick_and_place ###\none object\n\n"
                               "### TASK: pick_two_obj_and_place ###\ntwo objects\n"}
    bank = SkillBank.load(write_bank(tmp_path, files, {"pick_and_place": "pick_and_place",
                                                       "pick_two_obj_and_place": "pick_and_place"}))
    assert bank.context("pick_and_place") == "one object"
    assert bank.context("pick_two_obj_and_place") == "two objects"
