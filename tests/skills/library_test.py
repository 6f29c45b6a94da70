"""SAGE's skill library: AST extraction, calls found, validation in a fresh sandbox, chains apart."""

from skilljax.envs.apps.sandbox import Sandbox
from skilljax.skills.library import (SkillLibrary, extract_functions, sandbox_validator, used_in)

CODE = '''
import math

def area(r):
    """Area of a circle.

    More text."""
    def helper(x):
        return x * x
    return math.pi * helper(r)

@staticmethod
def total(xs, start=0, *, scale=1):
    return start + scale * sum(xs)

print(area(2))

def area(r, pi=3):
    return pi * r * r
'''


def test_extract_top_level_functions():
    fns = extract_functions(CODE, task=1)
    assert [f.name for f in fns] == ["total", "area"]     # the later `area` replaces the first
    total, area = fns
    assert total.signature == "total(xs, start=0, *, scale=1)" and total.doc == ""
    assert total.source.startswith("@staticmethod\ndef total(")
    assert area.source == "def area(r, pi=3):\n    return pi * r * r" and area.task == 1
    first = extract_functions(CODE.split("@staticmethod")[0])[0]
    assert first.doc == "Area of a circle." and "def helper" in first.source
    assert extract_functions("def broken(:\n  pass") == []


def test_used_in_finds_calls_only():
    code = "x = area(2)\ny = total\nz = obj.area(3)\nprint(helper(1))"
    assert used_in(code, ["area", "total", "helper"]) == {"area", "helper"}
    assert used_in("not python (", ["area"]) == set()


def test_library_validates_in_a_fresh_sandbox_and_chains_stay_apart(tmp_path):
    lib = SkillLibrary(sandbox_validator(tmp_path))
    good = extract_functions("def double(x):\n    '''Twice x.'''\n    return 2 * x\n")
    bad = extract_functions("def bad(x=undefined_name):\n    return x\n")
    needs = extract_functions("def quad(x):\n    return double(double(x))\n")
    assert lib.add(good + bad + needs) == ["double", "quad"]
    assert lib.rejected[0][0] == "bad" and "NameError" in lib.rejected[0][1]
    assert lib.listing().splitlines() == ["Functions from earlier tasks, callable as they are:",
                                          "- double(x): Twice x.", "- quad(x)"]
    # The next task of this chain has the functions; a task of another chain does not.
    with Sandbox(tmp_path / "same", setup=lib.setup_code()) as box:
        assert box.run("print(quad(3))").output.strip() == "12"
    other = SkillLibrary(sandbox_validator(tmp_path))
    with Sandbox(tmp_path / "other", setup=other.setup_code()) as box:
        result = box.run("quad(3)")
        assert not result.ok and "NameError" in result.error
    assert len(lib) == 2 and len(other) == 0 and other.listing() == ""
