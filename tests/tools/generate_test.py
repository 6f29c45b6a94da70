"""`python -m skilljax.tools.generate` as DESIGN §3 specifies it."""

import json

import pytest

from tests.conftest import QWEN3_TINY, build_hf_model, run_module
from tests.sampling_test import hf_greedy

PROMPTS = [[5, 17, 99, 4, 150, 8, 42], [3, 1], [120, 64, 33, 31, 30]]
EOS = 7


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    return path, build_hf_model(path, **QWEN3_TINY, eos_token_id=EOS)


def write_prompts(path):
    path.write_text("".join(json.dumps({"token_ids": p}) + "\n" for p in PROMPTS))
    return path


def test_generate_cli_greedy_matches_transformers(tmp_path, checkpoint):
    path, ref_model = checkpoint
    out = tmp_path / "out.jsonl"
    proc = run_module("skilljax.tools.generate", "--checkpoint", path, "--prompts",
                      write_prompts(tmp_path / "in.jsonl"), "--max-new-tokens", 20,
                      "--temperature", 0, "--repeat", 3, "--out", out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["token_ids"] for r in rows] == hf_greedy(ref_model, PROMPTS, 20, [EOS])
    assert all(len(r["logprobs"]) == len(r["token_ids"]) for r in rows)
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(stats) == {"decode_tokens_per_s", "prefill_tokens_per_s", "compile_s"}
    assert stats["decode_tokens_per_s"] > 0 and stats["compile_s"] > 0


@pytest.mark.slow  # in `bash run.sh test-slow`: ~30 s
def test_generate_cli_seed_and_mesh(tmp_path, checkpoint):
    path, _ = checkpoint
    prompts = write_prompts(tmp_path / "in.jsonl")

    def run(seed, *extra):
        out = tmp_path / f"out{seed}{len(extra)}.jsonl"
        run_module("skilljax.tools.generate", "--checkpoint", path, "--prompts", prompts,
                   "--max-new-tokens", 12, "--temperature", 1.0, "--top-p", 0.9, "--top-k", 30,
                   "--seed", seed, "--out", out, *extra)
        return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]

    a = run(1)
    assert run(1, "--mesh", "data=2,fsdp=2,tensor=2") == a  # same key, sharded over 8 devices
    assert run(2) != a


def test_generate_cli_bad_prompts_file(tmp_path, checkpoint):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1, 2]}\n')
    proc = run_module("skilljax.tools.generate", "--checkpoint", checkpoint[0], "--prompts", bad,
                      "--max-new-tokens", 4, "--temperature", 0, "--out", tmp_path / "o.jsonl",
                      check=False)
    assert proc.returncode != 0 and "bad.jsonl:1" in proc.stderr and "token_ids" in proc.stderr
