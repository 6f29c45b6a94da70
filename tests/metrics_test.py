
import time

import numpy as np
import pytest

from skilljax.metrics import MetricsWriter, read_metrics


def test_jsonl_and_tensorboard(tmp_path):
    w = MetricsWriter(tmp_path)
    w.write(1, {"loss": np.float32(0.5), "clip_frac": 0.1, "top_phrases": [["a", "b"]], "nan": float("nan")})
    w.write(2, {"loss": 0.25})
    w.close()
    rows = read_metrics(tmp_path)
    assert rows[0] == {"step": 1, "loss": 0.5, "clip_frac": 0.1, "top_phrases": [["a", "b"]], "nan": "nan"}
    assert rows[1] == {"step": 2, "loss": 0.25}
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_resume_drops_steps_after_checkpoint(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=False)
    for s in range(1, 5):
        w.write(s, {"loss": s})
    w.close()
    w = MetricsWriter(tmp_path, tensorboard=False, resume_step=3)  # checkpoint was at step 2
    w.write(3, {"loss": 30})
    w.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 2), (3, 30)]


def test_resume_skips_a_half_written_line(tmp_path):
    """A process killed mid-write leaves a truncated last line; resume drops it."""
    w = MetricsWriter(tmp_path, tensorboard=False)
    w.write(1, {"loss": 1})
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    w = MetricsWriter(tmp_path, tensorboard=False, resume_step=2)
    w.write(2, {"loss": 2})
    w.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 2)]


def test_wandb_missing_is_explained(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_wandb(name, *a, **k):
        if name == "wandb":
            raise ImportError("no wandb")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match="pip install wandb"):
        MetricsWriter(tmp_path, tensorboard=False, wandb_project="x")


def test_wandb_offline_run_per_workdir(tmp_path, monkeypatch):
    """`metrics.wandb_project` logs to W&B too; offline mode writes the run in the workdir, and a
    resumed writer continues the same run (its id is kept in the workdir)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = MetricsWriter(tmp_path, tensorboard=False, wandb_project="skilljax-test",
                      wandb_mode="offline", config={"seed": 3})
    w.write(1, {"loss_probe": 0.625, "active_files": ["a"]})
    w.close()
    run_id = (tmp_path / "wandb_run_id").read_text()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1
    # W&B's service process writes the run file; on a loaded machine its records can land a
    # moment after finish() returns (CI once read only the 7-byte header), so wait for them.
    log = next(runs[0].glob("*.wandb"))
    deadline = time.monotonic() + 60
    while b"0.625" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    data = log.read_bytes()
    assert b"loss_probe" in data and b"0.625" in data
    w = MetricsWriter(tmp_path, tensorboard=False, wandb_project="skilljax-test",
                      wandb_mode="offline", resume_step=2)
    w.write(2, {"loss_probe": 0.5})
    w.close()
    assert (tmp_path / "wandb_run_id").read_text() == run_id
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
