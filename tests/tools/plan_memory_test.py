"""The memory plan compiles a config's learner step and sampler on a fake mesh, allocating nothing."""

import json
import subprocess
import sys

import pytest

from skilljax.sampling import bucket_length
from tests.conftest import ROOT, run_module

KEYS = ("devices", "params", "train_bytes_per_device", "prefill_bytes_per_device",
        "decode_bytes_per_device", "compile_s")


@pytest.mark.slow  # in `bash run.sh test-slow`: compiles a sharded plan
def test_plan_memory_on_a_fake_mesh():
    proc = run_module("skilljax.tools.plan_memory", "--config", "configs/alfworld_skill0.py:runlocal",
                      "--mesh", "fsdp=4", "--config.model.dtype=bfloat16",
                      "--config.model.lora.rank=2", "--config.prompt.max_prompt_tokens=256",
                      "--config.rl.max_staleness=2")
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(k in plan for k in KEYS), plan
    assert plan["devices"] == 4 and plan["lora_rank"] == 2
    assert 0 < plan["trainable_params"] < plan["params"]
    assert plan["sampler_shape"]["inference_layout"] == "tp"  # weights gathered out of fsdp
    # prompt + response tokens in the learner's length bucket; rows split over the 4 devices
    assert plan["train_shape"]["seq"] == bucket_length(256 + 16) and plan["train_shape"]["rows"] % 4 == 0
    # bfloat16 compute on CPU: temporaries from the float32 compile (see plan_memory.plan).
    assert "float32" in plan["temporaries_from"]
    for name in ("train", "prefill", "decode"):
        assert 0 < plan[f"{name}_bytes_per_device"]
    assert plan["sampling_peak_bytes_per_device"] >= plan["decode_bytes_per_device"]
    # Rollouts beside the update: both at once, and a second weight snapshot (bfloat16, tp=1).
    assert plan["async_peak_bytes_per_device"] == (
        plan["train_bytes_per_device"] + plan["params"] * 2
        + max(plan["prefill_bytes_per_device"], plan["decode_bytes_per_device"]))
    assert "train step" in proc.stdout  # the table before the JSON


def test_plan_memory_names_a_bad_checkpoint():
    proc = run_module("skilljax.tools.plan_memory", "--config",
                      "configs/alfworld_skill0.py:checkpoint=qwen9_400b", "--mesh", "fsdp=2",
                      check=False)
    assert proc.returncode != 0 and "neither an HF directory nor a preset" in proc.stderr


@pytest.mark.slow  # in `bash run.sh test-slow`: a benchmark's smoke run
def test_bench_accelerator_smoke():
    proc = subprocess.run([sys.executable, "launch/bench_accelerator.py", "--smoke"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["decode"][0]["decode_tokens_per_s"] > 0
    assert 0 < out["decode"][0]["roofline_fraction_measured_bw"]
    assert out["train"]["tokens_per_s"] > 0
