"""`python -m skilljax.tools.export_hf`: what it writes loads in transformers with identical logits."""

import json

import numpy as np

from tests.conftest import QWEN2_TINY, build_hf_model, run_module, torch_logits

IDS = [[5, 17, 99, 4, 150, 8, 42, 7, 1]]


def test_export_cli_round_trip(tmp_path, qwen3_tokenizer_dir):
    import transformers
    src = tmp_path / "src"
    ref = torch_logits(build_hf_model(src, **QWEN2_TINY), IDS)
    for f in qwen3_tokenizer_dir.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "out"
    proc = run_module("skilljax.tools.export_hf", "--checkpoint", src, "--out", out)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["model_type"] == "qwen2"
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_array_equal(torch_logits(model, IDS), ref)
    assert (out / "tokenizer.json").exists()
    again = run_module("skilljax.tools.export_hf", "--checkpoint", src, "--out", out, check=False)
    assert again.returncode != 0 and "overwrite" in again.stderr


def test_export_preset_loads_in_transformers(tmp_path):
    import transformers
    out = tmp_path / "tiny"
    run_module("skilljax.tools.export_hf", "--checkpoint", "tiny", "--out", out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 410368
