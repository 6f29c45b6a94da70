"""The sampler benchmark runs end to end (figures are for the issue note, not asserted here)."""

import json

import pytest

from tests.conftest import run_module


@pytest.mark.slow  # in `bash run.sh test-slow`: a benchmark's smoke run
def test_bench_sampler_reports_ratio():
    proc = run_module("skilljax.tools.bench_sampler", "--configs", "tiny", "--batch", 4,
                      "--new-tokens", 16, "--repeats", 3)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    row = result["configs"]["tiny"]
    assert row["skilljax"]["tokens"] == row["transformers"]["tokens"] == 4 * 16
    assert row["decode_ratio"] > 0 and result["matmul_peak_gflops"] > 0
    assert 0 < row["skilljax"]["bandwidth_fraction"] and row["bandwidth_gb_s"] > 0


@pytest.mark.slow  # in `bash run.sh test-slow`: a benchmark's smoke run
def test_bench_sampler_rollout_shapes():
    proc = run_module("skilljax.tools.bench_sampler", "--configs", "tiny", "--rollout-shapes",
                      "2x4", "--shared-prefix", 32, "--new-tokens", 16, "--repeats", 1)
    row = json.loads(proc.stdout.strip().splitlines()[-1])["tiny"]
    assert row["same_tokens"] and row["rows"] == 8
    assert row["prefill_tokens_computed"] < row["prompt_tokens"]
    assert {"neither", "shared_prefix", "compaction", "both"} <= set(row)
