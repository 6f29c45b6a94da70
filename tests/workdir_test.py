"""A workdir may be remote (gs://...): the run's own files go through etils.epath. Tested with
epath's mock file system mapping gs://bucket to a local directory (orbax checkpoints reach GCS
through their own tensorstore driver, which this cannot mock)."""

import os

import pytest
from etils import epath
from etils.epath import testing

from skilljax import config as config_lib
from skilljax import plots
from skilljax.metrics import MetricsWriter, is_local, read_metrics
from skilljax.tokenizer import Tokenizer


@pytest.fixture
def bucket(tmp_path):
    root = str(tmp_path)
    local = lambda p: os.fspath(p).replace("gs://bucket", root)
    one = lambda fn, p, *a, **k: fn(local(p), *a, **k)
    two = lambda fn, p, d, *a, **k: fn(local(p), local(d), *a, **k)
    with testing.mock_epath(open=one, exists=one, isdir=one, listdir=one, glob=one, makedirs=one,
                            mkdir=one, remove=one, rmtree=one, stat=one, rename=two, replace=two):
        yield tmp_path


def test_run_files_in_a_remote_workdir(bucket):
    workdir = "gs://bucket/runs/a"
    assert not is_local(epath.Path(workdir)) and is_local(bucket)
    epath.Path(workdir).mkdir(parents=True)  # as build_run does
    c = config_lib.base_config()
    c.rl.steps = 7
    config_lib.write_json(epath.Path(workdir) / "config.json", config_lib.to_dict(c))
    assert config_lib.workdir_config(workdir).rl.steps == 7

    writer = MetricsWriter(workdir, tensorboard=False)  # no append on object stores: rewritten
    for step in (1, 2, 3):
        writer.write(step, {"success_rate": step / 10, "val_without_skills": 0.1 * step})
    writer.close()
    resumed = MetricsWriter(workdir, tensorboard=False, resume_step=3)  # drops step 3
    resumed.write(3, {"success_rate": 0.5})
    resumed.close()
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3]
    assert read_metrics(workdir)[-1]["success_rate"] == 0.5
    assert (bucket / "runs" / "a" / "metrics.jsonl").exists()

    tok = Tokenizer.train(["pick up the apple", "go to the fridge"], vocab_size=300)
    tok.save(f"{workdir}/tokenizer")
    assert Tokenizer.load(f"{workdir}/tokenizer").encode("the apple") == tok.encode("the apple")

    written = plots.write_all(workdir)
    assert written and all((bucket / "runs" / "a" / "plots" / p.name).stat().st_size > 0
                           for p in written)


def test_plots_title_stages_gaps_and_smoothing(tmp_path):
    """Figures name the run and its seed; stage boundaries come from budget changes; a file
    withdrawn at an update is a gap in its Δ curve, not a 0."""
    import json
    import math
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"seed": 7}))
    w = MetricsWriter(tmp_path / "run", tensorboard=False)
    rows = []
    for step in range(1, 9):
        r = {"success_rate": step / 10, "budget": 2 if step <= 4 else 0,
             "active_skills": 2 if step <= 4 else 0,
             "active_files": ["a", "b"] if step <= 4 else ([] if step > 5 else ["a"])}
        if step in (2, 4, 6):
            r.update(val_without_skills=0.3, val_with_skills=0.5, val_full_skills=0.6,
                     deltas={"a": 0.25, "b": 0.0 if step == 6 else -0.1})
        w.write(step, r)
        rows.append(dict(r, step=step))
    w.close()
    assert plots._title(epath.Path(tmp_path / "run")) == "run, seed 7"
    assert plots._stages(rows) == [(5, 0)]
    series = plots.delta_series([r for r in rows if "deltas" in r])
    assert series["a"][:2] == [(2, 0.25), (4, 0.25)] and math.isnan(series["a"][2][1])
    assert math.isnan(series["b"][2][1])           # withdrawn at step 6: a gap, not its 0.0
    assert plots.smooth([0.0, 1.0, 1.0]) == [0.0, 0.1, pytest.approx(0.19)]
    names = {p.name for p in plots.write_all(tmp_path / "run")}
    assert {"success.png", "deltas.png", "skills.png", "tokens.png"} <= names
