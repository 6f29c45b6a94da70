"""`python -m skilljax.tools.logits` as DESIGN §3 specifies it, with and without --mesh."""

import json

import numpy as np
import pytest

from tests.conftest import QWEN2_TINY, QWEN3_TINY, build_hf_model, rel_err, run_module, torch_logits

IDS = [5, 17, 99, 4, 150, 8, 42, 7, 1]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in (("qwen2", QWEN2_TINY), ("qwen3", QWEN3_TINY)):
        path = tmp_path_factory.mktemp(name)
        out[name] = (path, torch_logits(build_hf_model(path, **cfg), [IDS])[0])
    return out


@pytest.mark.parametrize("which,mesh,layout", [
    ("qwen2", None, None),
    ("qwen3", "data=1,fsdp=8,tensor=1", "fsdp"),
    ("qwen2", "data=2,fsdp=1,tensor=4", "tp"),
    ("qwen3", "data=1,fsdp=2,tensor=2", "fsdp_tp"),
])
def test_logits_cli_matches_transformers(tmp_path, checkpoints, which, mesh, layout):
    path, ref = checkpoints[which]
    out = tmp_path / "logits.npy"
    args = ["--checkpoint", path, "--token-ids", ",".join(map(str, IDS)), "--dtype", "float32",
            "--out", out]
    if mesh:
        args += ["--mesh", mesh, "--layout", layout]
    proc = run_module("skilljax.tools.logits", *args)
    logits = np.load(out)
    assert logits.dtype == np.float32 and logits.shape == (len(IDS), 160)
    assert rel_err(logits, ref) <= 1e-4
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["shape"] == [len(IDS), 160]
    if mesh:
        sizes = dict(kv.split("=") for kv in mesh.split(","))
        assert stats["mesh"] == {k: int(v) for k, v in sizes.items()}


def test_logits_cli_rejects_out_of_range_ids(checkpoints):
    proc = run_module("skilljax.tools.logits", "--checkpoint", checkpoints["qwen2"][0],
                      "--token-ids", "1,2,999", check=False)
    assert proc.returncode != 0 and "token ids must lie in [0, 160)" in proc.stderr
