"""The rollout benchmark runs end to end (figures go in the issue note, not asserted here)."""

import json

import pytest

from tests.conftest import run_module


@pytest.mark.slow  # in `bash run.sh test-slow`: a benchmark's smoke run
def test_bench_rollout_runs():
    proc = run_module("skilljax.tools.bench_rollout", "--tasks", 1, "--group", 2, "--turns", 2,
                      "--max-new-tokens", 4, "--repeats", 1, "--workers", 1, "--env-overlap")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["episodes"] == 2
    for mode in ("policy", "expert", "env_overlap"):
        assert out[mode]["steps_per_s"] > 0 and out[mode]["prompt_tokens"] > 50
    assert out["env_overlap_speedup"] > 0
