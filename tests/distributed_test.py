"""Two CPU processes train one run together (the multi-host path of launch/tpu.sh and gpu.sh)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from skilljax import distributed
from tests.conftest import ROOT

CONFIG = str(ROOT / "configs" / "default.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJAX_")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **extra)
    return env


def test_single_process_is_untouched(monkeypatch):
    for k in ("SKILLJAX_COORDINATOR", "SKILLJAX_DISTRIBUTED"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.initialize_from_env() is False and distributed.is_main()
    monkeypatch.setenv("SKILLJAX_COORDINATOR", "localhost:1")
    with pytest.raises(ValueError, match="SKILLJAX_NUM_PROCESSES"):
        distributed.initialize_from_env()


@pytest.mark.slow  # in `bash run.sh test-slow`: two trainer processes, ~3 min
def test_two_processes_train_like_one(tmp_path):
    port = _free_port()
    # SkillForge on too (it composes with the curriculum): its evolution runs on the first
    # process, and the others take its bank.
    args = ["--config", CONFIG + ":runlocal", "--config.mesh=data=2", "--config.rl.steps=2",
            "--config.skills.validate_every=1", "--config.evolution.enabled=true",
            "--config.evolution.initial_bank=skills/chores/skillforge_bank.json",
            "--config.evolution.every=1", "--config.evolution.embedder=tfidf"]
    procs = []
    for pid in range(2):
        env = _env(SKILLJAX_COORDINATOR=f"localhost:{port}", SKILLJAX_NUM_PROCESSES="2",
                   SKILLJAX_PROCESS_ID=str(pid),
                   XLA_FLAGS="--xla_force_host_platform_device_count=1")
        log = open(tmp_path / f"p{pid}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "skilljax.train", *args, "--workdir", str(tmp_path / "multi")],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=600) for p in procs]
    assert codes == [0, 0], "\n".join((tmp_path / f"p{i}.log").read_text()[-3000:] for i in range(2))
    single = subprocess.run([sys.executable, "-m", "skilljax.train", *args, "--workdir",
                             str(tmp_path / "single")],
                            env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=2"), cwd=ROOT,
                            capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-3000:]
    multi = json.loads((tmp_path / "multi" / "summary.json").read_text())
    one = json.loads((tmp_path / "single" / "summary.json").read_text())
    # The same mesh shape (2 devices) in one process or in two gives the same run. Rollouts are
    # keyed per task group and generated as one global batch, and the shares are gathered before
    # anything is computed from them, so episodes, success rates, validation and evaluation are
    # equal exactly; losses and gradient norms to rel 1e-4, since the cross-process reductions
    # (gloo) may sum the two devices' partial sums in another order than one process does.
    assert multi["eval"] == one["eval"]
    assert multi["curriculum"] == one["curriculum"]
    assert multi["evolution"] == one["evolution"] and multi["evolution"]["abstracted"] > 0
    assert (tmp_path / "multi" / "skills" / "bank.json").read_bytes() == \
        (tmp_path / "single" / "skills" / "bank.json").read_bytes()
    assert multi["warm_start"]["final_loss"] == pytest.approx(one["warm_start"]["final_loss"],
                                                              rel=1e-4)
    read = lambda d: [json.loads(r) for r in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    rows, single_rows = read("multi"), read("single")
    assert [r["step"] for r in rows] == [1, 2] == [r["step"] for r in single_rows]
    for r, s in zip(rows, single_rows):
        for k in ("success_rate", "invalid_rate", "env_steps", "reward_mean", "trained_samples",
                  "val_without_skills", "optimizer_steps", "episodes"):
            assert r[k] == s[k], k
        for k in ("loss", "grad_norm", "entropy"):
            assert r[k] == pytest.approx(s[k], rel=1e-4, abs=1e-7), k
        # Each process played half of the episodes (2 task groups of 2, one group each).
        assert (r["episodes"], r["episodes_local"], s["episodes_local"]) == (4, 2, 4)
    assert "episodes 2/4" in (tmp_path / "p1.log").read_text()
    assert "skilljax.train: workdir" in (tmp_path / "p1.log").read_text()
