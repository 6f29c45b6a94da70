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
