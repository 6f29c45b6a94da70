"""The train-step benchmark runs end to end (figures go in the issue note, not asserted here)."""

import json

import pytest

from skilljax.models import qwen
from skilljax.tools.bench_train import train_flops_per_token
from tests.conftest import run_module


@pytest.mark.slow  # in `bash run.sh test-slow`: a benchmark's smoke run
def test_bench_train_runs():
    proc = run_module("skilljax.tools.bench_train", "--configs", "tiny", "--batch", 4,
                      "--seq-len", 64, "--response-len", 8, "--micro-batch", 2, "--repeats", 1)
    row = json.loads(proc.stdout.strip().splitlines()[-1])["configs"]["tiny"]
    for mode in ("full", "window"):
        assert row[mode]["tokens_per_s"] > 0 and 0 < row[mode]["peak_fraction"] < 1
    assert row["window_speedup"] > 0


def test_flops_count_by_hand():
    cfg = qwen.PRESETS["tiny"]  # tied: the embedding matrix is also the LM head, counted once
    attn = 4 * 2 * 4 * 32 * 16
    assert train_flops_per_token(cfg, 16) == 3 * (2 * cfg.num_params() + attn)
