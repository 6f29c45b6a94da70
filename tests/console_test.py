"""Console lines: level, time, process and step; bars only where asked; a bad mode named."""

import re

import pytest

from skilljax import console


@pytest.fixture(autouse=True)
def propagation_restored():
    """`console.setup` (an entry point's) stops the skilljax logger propagating; later tests in
    this process read its records through pytest's root handler."""
    yield
    console.logger.propagate = True


def test_lines_name_level_time_process_and_step(capsys):
    console.setup("off")
    console.set_step(None)
    console.info("built")
    console.set_step(7)
    console.info("success %.3f", 0.5)
    console.warning("slow step")
    console.set_step(None)
    lines = capsys.readouterr().out.strip().splitlines()[-3:]
    stamp = r"\d{4} \d\d:\d\d:\d\d\.\d{3}"
    assert re.fullmatch(rf"I{stamp} p0\] built", lines[0]), lines[0]
    assert re.fullmatch(rf"I{stamp} p0 step 7\] success 0\.500", lines[1]), lines[1]
    assert re.fullmatch(rf"W{stamp} p0 step 7\] slow step", lines[2]), lines[2]


def test_bars_follow_the_mode(capsys):
    console.setup("auto")  # pytest's stderr is not a terminal: no bar
    with console.bar(3, "RL") as bar:
        assert bar.disable
        bar.update(3)
    assert "RL" not in capsys.readouterr().err
    console.setup("on")
    with console.bar(3, "RL") as bar:
        assert not bar.disable
        bar.update(3)
    assert "RL" in capsys.readouterr().err
    console.setup("off")
    with pytest.raises(ValueError, match="metrics.progress='sometimes'.*auto"):
        console.setup("sometimes")


def test_module_loggers_write_through_the_console(capsys):
    import logging
    console.setup("off")
    logging.getLogger("skilljax.skills.evolver").info("induced 2 skills")
    assert re.search(r"^I\d{4} .* p0\] induced 2 skills$", capsys.readouterr().out, re.M)


def test_step_and_eval_lines():
    m = dict(success_rate=0.375, invalid_rate=0.031, episodes_local=24, episodes=48, step_s=12.34,
             val_without_skills=0.5, val_with_skills=0.75)
    assert console.step_line(12, 180, m, 6) == ("step 12/180: success 0.375 invalid 0.031 skills 6 "
                                                "episodes 24/48 (12.3s) val without 0.50 active 0.75")
    m.update(bank_size=7, skill_calls=1.5, sgc=0.25, library_size=0.5, skill_use_rate=1.0)
    assert console.step_line(1, 2, m, 0).endswith(
        " bank 7 calls/episode 1.50 sgc 0.250 library 0.50 skill use 1.00")
    block = {"with_skills": dict(success_rate=0.8, tokens_per_step=120.4,
                                 scenario_success_rate=0.55),
             "without_skills": dict(success_rate=0.5, tokens_per_step=60)}
    assert console.eval_line("final", block) == ("eval final: with skills 0.800, SGC 0.550 "
                                                 "(120 tok/step), without 0.500 (60 tok/step)")
