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


# ----------------------------------------------------------------------------- Qwen2.5-VL --images


@pytest.fixture(scope="module")
def vl_checkpoint(tmp_path_factory):
    """A tiny random Qwen2.5-VL checkpoint and two PNGs (4 x 4 and 6 x 10 patch grids at the
    processor's default pixel bounds: 4 and 15 image-pad tokens)."""
    from tests.models.qwen_vl_test import build_hf_vl, noise_image
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    ref = build_hf_vl(path, seed=2)
    files = []
    for i, (h, w) in enumerate(((56, 56), (84, 140))):
        files.append(path / f"image{i}.png")
        noise_image(h, w, 20 + i).save(files[-1])
    return path, ref, files


def vl_reference(ref, ids, files):
    """transformers' logits [T, V], the images through its own (PIL) image processor."""
    import torch
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tests.models.qwen_vl_test import IMAGE
    pixels = Qwen2VLImageProcessorPil()([Image.open(f) for f in files], return_tensors="pt")
    ids_t = torch.as_tensor([ids])
    with torch.no_grad():
        out = ref(input_ids=ids_t, attention_mask=torch.ones_like(ids_t),
                  pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                  mm_token_type_ids=(ids_t == IMAGE).long())
    return out.logits[0].float().numpy(), pixels["image_grid_thw"].tolist()


@pytest.mark.parametrize("images,mesh", [
    ((0,), None), pytest.param((0, 1), "data=1,fsdp=2,tensor=2", marks=pytest.mark.slow)])
def test_logits_cli_with_images_matches_transformers(tmp_path, vl_checkpoint, images, mesh):
    from tests.models.qwen_vl_test import prompt
    path, ref, files = vl_checkpoint
    files = [files[i] for i in images]
    ids = [int(t) for t in prompt([(4, 15)[i] for i in images], [3] + [4] * len(images), 1)]
    want, grids = vl_reference(ref, ids, files)
    out = tmp_path / "logits.npy"
    args = ["--checkpoint", path, "--token-ids", ",".join(map(str, ids)), "--dtype", "float32",
            "--images", ",".join(map(str, files)), "--out", out]
    if mesh:
        args += ["--mesh", mesh, "--layout", "fsdp_tp"]
    stats = json.loads(run_module("skilljax.tools.logits", *args).stdout.strip().splitlines()[-1])
    logits = np.load(out)
    err = rel_err(logits, want)
    print(f"{len(files)} image(s), grids {grids}, mesh {mesh}: max relative error {err:.2e}")
    assert logits.shape == (len(ids), 256) and err <= 1e-4
    assert stats["image_grid_thw"] == grids


def test_logits_cli_image_errors(vl_checkpoint, checkpoints):
    from tests.models.qwen_vl_test import prompt
    path, _, files = vl_checkpoint
    ids = ",".join(map(str, prompt([4], [3, 4], 1)))
    proc = run_module("skilljax.tools.logits", "--checkpoint", path, "--token-ids", ids, "--images",
                      f"{files[0]},{files[1]}", check=False)
    assert proc.returncode != 0
    assert ("--token-ids hold 4 image-pad tokens (id 250); the images' grids need 19 "
            f"({files[0]}: 4, {files[1]}: 15)") in proc.stderr
    proc = run_module("skilljax.tools.logits", "--checkpoint", path, "--token-ids", ids, check=False)
    assert proc.returncode != 0
    assert "hold 4 image-pad tokens (id 250); the images' grids need 0 (no --images)" in proc.stderr
    proc = run_module("skilljax.tools.logits", "--checkpoint", checkpoints["qwen2"][0],
                      "--token-ids", "1,2,3", "--images", files[0], check=False)
    assert proc.returncode != 0
    assert "--images needs a Qwen2.5-VL checkpoint (model_type qwen2_5_vl)" in proc.stderr
