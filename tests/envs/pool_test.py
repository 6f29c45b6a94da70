import os
import sys
import time

import pytest

from skilljax.envs import base
from skilljax.envs.pool import EnvPool

PROBE = "tests.envs.probe_env:Probe"
TASKS = base.env_class(PROBE).make_tasks("test", 6, seed=1)


@pytest.fixture
def pool():
    with EnvPool(PROBE, num_workers=2, timeout_s=2.0) as p:
        yield p


def test_reset_step_expert_roundtrip(pool):
    resets = pool.reset(TASKS, seeds=list(range(100, 106)))
    assert [r.failure for r in resets] == [None] * 6
    assert resets[3].observation.startswith("start test-1-3 seed 103")
    pids = {r.observation.split()[-1] for r in resets}
    assert len(pids) == 2  # fanned out over both workers
    experts = pool.expert_actions(range(6))
    assert experts == {i: f"win{i % 3}" for i in range(6)}
    out = pool.step({i: experts[i] if i % 2 == 0 else "ok" for i in range(6)})
    for i, r in out.items():
        assert r.won == (i % 2 == 0) and r.reward == (10.0 if i % 2 == 0 else 0.0)
        assert r.info["seed"] == 100 + i
    # Output on the worker's stdout does not corrupt the protocol.
    assert pool.step({1: "print"})[1].observation == "print at 2"


def test_crashed_worker_fails_its_episodes_and_the_run_goes_on(pool):
    pool.reset(TASKS, seeds=[0] * 6)
    out = pool.step({0: "crash", 1: "ok", 2: "ok", 3: "ok", 4: "ok", 5: "ok"})
    # Episode 0 crashed worker 0, which also held episodes 2 and 4 (their state died with it).
    assert out[0].done and not out[0].won and "died" in out[0].info["failure"]
    for i in (2, 4):
        assert out[i].done and "lost when worker 0 was restarted" in out[i].info["failure"]
    for i in (1, 3, 5):
        assert not out[i].done and "failure" not in out[i].info
    assert pool.restarts == 1
    assert pool.step({0: "ok"})[0].info["failure"] == out[0].info["failure"]  # stays failed
    assert not pool.step({1: "ok"})[1].done
    # The restarted worker serves new episodes normally.
    resets = pool.reset(TASKS[:2], seeds=[0, 0])
    assert [r.failure for r in resets] == [None, None]
    assert pool.step({0: "win0"})[0].won
    pool.close()  # a worker died: its log directory is kept for the user to read
    assert os.path.isdir(pool.log_dir)


def test_clean_close_removes_its_log_directory():
    with EnvPool(PROBE, num_workers=1) as p:
        assert os.path.isdir(p.log_dir)
    assert not os.path.exists(p.log_dir)


def test_hung_step_times_out(pool):
    pool.reset(TASKS[:4], seeds=[0] * 4)
    start = time.monotonic()
    out = pool.step({0: "ok", 1: "hang", 2: "ok", 3: "ok"})
    assert time.monotonic() - start < 10
    assert "hung" in out[1].info["failure"] and out[1].done
    assert "lost when worker 1" in out[3].info["failure"]
    assert not out[0].done and not out[2].done
    assert pool.step({0: "win0"})[0].won


def test_env_exception_fails_only_that_episode(pool):
    pool.reset(TASKS[:2], seeds=[0, 0])
    out = pool.step({0: "raise", 1: "ok"})
    assert "ValueError: probe asked to raise" in out[0].info["failure"]
    assert not out[1].done and pool.restarts == 0


def test_crash_during_reset_retries_the_others():
    tasks = list(TASKS[:4])
    tasks[0] = base.Task("bad", "probe", "test", {"goal": 0, "crash_on_reset": True})
    with EnvPool(PROBE, num_workers=2, timeout_s=2.0) as pool:
        resets = pool.reset(tasks, seeds=[0] * 4)
        assert "died" in resets[0].failure
        assert [r.failure for r in resets[1:]] == [None] * 3
        assert pool.step({2: "win2"})[2].won  # episode 2 shared the crashed worker


def test_throughput_scales_with_workers():
    def run(workers):
        with EnvPool(PROBE, num_workers=workers, env_kwargs={"sleep_s": 0.05}) as pool:
            pool.reset(TASKS[:4], seeds=[0] * 4)
            start = time.monotonic()
            for _ in range(4):
                pool.step({i: "ok" for i in range(4)})
            return time.monotonic() - start
    one, two = run(1), run(2)
    assert one / two > 1.5, (one, two)  # 16 sleeps of 50 ms: 0.8 s vs 0.4 s


def test_worker_start_failure_is_explained(tmp_path):
    with pytest.raises(base.EnvError, match="(?s)did not start.*ModuleNotFoundError"):
        EnvPool("no_such_module_xyz:Env", num_workers=1, log_dir=str(tmp_path))


def test_other_interpreter(tmp_path):
    # Any interpreter that can import skilljax.envs works; here the same one, through a wrapper.
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    with EnvPool(PROBE, num_workers=1, python=str(wrapper)) as pool:
        assert pool.reset(TASKS[:1], seeds=[0])[0].failure is None


def test_unknown_env_name():
    with pytest.raises(ValueError, match="Unknown environment 'nope'.*chores"):
        EnvPool("nope")
