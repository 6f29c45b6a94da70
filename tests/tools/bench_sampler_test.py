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
