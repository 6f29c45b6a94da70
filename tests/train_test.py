"""The trainer end to end on the runlocal config: outputs, resume, evaluate, sweep listing."""

import json
import subprocess
import sys

import pytest

from skilljax import train as train_lib
from tests.conftest import ROOT, run_module

CONFIG = str(ROOT / "configs" / "default.py")


def test_overrides_and_errors():
    c = train_lib.load_config(CONFIG + ":runlocal", ["--config.rl.steps=3",
                                                     "--config.rl.learning_rate=1e-3",
                                                     "--config.skills.filter=false"])
    assert c.rl.steps == 3 and c.rl.learning_rate == 1e-3 and c.skills.filter is False
    with pytest.raises(KeyError, match="no 'nope'"):
        train_lib.load_config(CONFIG, ["--config.rl.nope=1"])
    with pytest.raises(ValueError, match="Unknown variant"):
        train_lib.load_config(CONFIG + ":variant=magic")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    wd = tmp_path_factory.mktemp("run")
    run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", wd)
    return wd


def test_runlocal_writes_everything(workdir):
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["wall_s"] > 0
    for phase in ("initial", "final"):
        for mode in ("with_skills", "without_skills"):
            block = summary["eval"][phase][mode]
            assert 0 <= block["success_rate"] <= 1 and block["tokens_per_step"] > 0
            assert set(block["per_task"]) == {"clean", "heat", "cool", "light", "place", "prepare"}
    w, wo = summary["eval"]["initial"]["with_skills"], summary["eval"]["initial"]["without_skills"]
    assert w["tokens_per_step"] > wo["tokens_per_step"]  # skill text costs tokens
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "deltas" in rows[1] and "val_with_skills" in rows[3]
    assert [u["step"] for u in summary["curriculum"]] == [2, 4]
    assert summary["warm_start"]["samples"] > 0
    for png in ("success.png", "deltas.png", "skills.png", "tokens.png", "eval.png"):
        assert (workdir / "plots" / png).stat().st_size > 1000
    assert (workdir / "tokenizer" / "tokenizer.json").exists()


def test_rerun_resumes_and_finishes(workdir):
    before = (workdir / "summary.json").read_text()
    proc = run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", workdir)
    assert "resumed from step 4" in proc.stdout and "warm start" not in proc.stdout
    assert json.loads((workdir / "summary.json").read_text())["eval"] == json.loads(before)["eval"]


def test_evaluate_cli(workdir):
    proc = run_module("skilljax.evaluate", "--config", CONFIG + ":runlocal", "--workdir", workdir)
    block = json.loads(proc.stdout.strip().splitlines()[-1])
    assert block["step"] == 4 and "with_skills" in block and "without_skills" in block
    assert (workdir / "eval_4.json").exists()


def test_sweep_lists_the_ablations():
    out = subprocess.run([sys.executable, str(ROOT / "launch" / "sweep.py"), CONFIG, "--workdir",
                          "/tmp/x", "--print"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.splitlines()
    assert len(out) == 14 and all("skilljax.train" in line for line in out)
    assert any("variant=no_skills,seed=1" in line for line in out)
