"""Console lines: level, time, process and step; bars only where asked; a bad mode named."""

import re

import pytest

from skilljax import console


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
