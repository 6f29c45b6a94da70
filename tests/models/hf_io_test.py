"""Checkpoint I/O: logits parity with transformers, sharded loads, export round trip, bad inputs."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skilljax import models, sharding
from skilljax.models import hf_io, qwen
from tests.conftest import QWEN2_TINY, QWEN3_TINY, build_hf_model, rel_err, torch_logits

IDS = np.array([[3, 17, 99, 4, 150, 8, 42, 7, 1, 120, 64, 33],
                [5, 5, 6, 140, 2, 9, 11, 13, 100, 77, 30, 31]])


def ours(path, ids=IDS, mesh=None, layout="fsdp_tp"):
    _, model = models.load(path, mesh, layout=layout)
    tokens = jnp.asarray(ids)
    return np.asarray(qwen.forward(model, tokens, jnp.ones_like(tokens)))


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    return path, build_hf_model(path, **QWEN2_TINY)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    return path, build_hf_model(path, **QWEN3_TINY)


@pytest.mark.parametrize("which", ["qwen2", "qwen3"])
def test_logits_match_transformers(which, qwen2_dir, qwen3_dir):
    path, ref_model = qwen2_dir if which == "qwen2" else qwen3_dir
    cfg = hf_io.read_config(path)
    if which == "qwen2":
        assert cfg.qkv_bias and not cfg.tie_embeddings and cfg.num_heads // cfg.num_kv_heads == 4
    else:
        assert cfg.qk_norm and cfg.tie_embeddings and cfg.num_heads // cfg.num_kv_heads == 2
        assert cfg.head_dim * cfg.num_heads != cfg.embed_dim
    ref = torch_logits(ref_model, IDS)
    assert rel_err(ours(path), ref) <= 1e-4


def test_rope_thetas_differ_and_each_match(tmp_path):
    outs = []
    for theta in (1e4, 1e6, 5e6):
        path = tmp_path / f"theta{theta:g}"
        ref_model = build_hf_model(path, **{**QWEN3_TINY, "rope_theta": theta})
        assert hf_io.read_config(path).rope_theta == theta
        out = ours(path)
        assert rel_err(out, torch_logits(ref_model, IDS)) <= 1e-4
        outs.append(out)
    # Same seed → same weights: only theta differs, and it must change the logits.
    for a, b in [(0, 1), (1, 2), (0, 2)]:
        assert rel_err(outs[a], outs[b]) > 1e-3


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
])
def test_rope_scaling_matches(tmp_path, scaling):
    ref_model = build_hf_model(tmp_path, **{**QWEN2_TINY, "rope_parameters":
                                           {"rope_theta": 1e4, **scaling}})
    cfg = hf_io.read_config(tmp_path)
    assert cfg.rope_scaling_dict["rope_type"] == scaling["rope_type"]
    assert rel_err(ours(tmp_path), torch_logits(ref_model, IDS)) <= 1e-4


def test_left_padded_batch_matches_transformers(qwen2_dir):
    path, ref_model = qwen2_dir
    mask = np.ones_like(IDS)
    mask[0, :5] = 0  # row 0 is left-padded by 5
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    ref = torch_logits(ref_model, IDS, attention_mask=mask, position_ids=positions)
    _, model = models.load(path)
    out = np.asarray(qwen.forward(model, jnp.asarray(IDS), jnp.asarray(mask)))
    real = mask.astype(bool)
    assert rel_err(out[real], ref[real]) <= 1e-4
    # Padding must not leak: row 0's real tokens alone give the same logits.
    alone = np.asarray(qwen.forward(model, jnp.asarray(IDS[:1, 5:]), jnp.ones((1, 7), int)))
    assert rel_err(out[0, 5:], alone[0]) <= 1e-5


def test_sharded_index_checkpoint(tmp_path):
    ref_model = build_hf_model(tmp_path, max_shard_size="40KB", **QWEN2_TINY)
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert rel_err(ours(tmp_path), torch_logits(ref_model, IDS)) <= 1e-4


LAYOUTS = [("fsdp", "fsdp=8"), ("tp", "data=2,tensor=4"), ("fsdp_tp", "data=2,fsdp=2,tensor=2")]


@pytest.mark.parametrize("layout,mesh_spec", LAYOUTS)
@pytest.mark.parametrize("which", ["qwen2", "qwen3"])
def test_mesh_layouts_match_and_split_params(layout, mesh_spec, which, qwen2_dir, qwen3_dir):
    path, ref_model = qwen2_dir if which == "qwen2" else qwen3_dir
    mesh = sharding.make_mesh(mesh_spec)
    assert mesh.size == 8
    _, model = models.load(path, mesh, layout=layout)
    params = {k: v.get_value() for k, v in hf_io._flat(__import__("flax").nnx.state(model))}
    big = ["layers.attn.q", "layers.attn.o", "layers.mlp.gate", "layers.mlp.down", "embedding"]
    for name in big:
        arr = params[name]
        assert arr.sharding.mesh.shape == mesh.shape
        assert sharding.is_split(arr), f"{name} is not split under {layout}: {arr.sharding.spec}"
        # Each shard holds 1/k of the array for the k devices the layout uses.
        used = np.prod([mesh.shape[a] for e in arr.sharding.spec if e
                        for a in ((e,) if isinstance(e, str) else e)])
        assert arr.addressable_shards[0].data.size * used == arr.size
    if layout == "fsdp":
        assert params["layers.mlp.up"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None)
    if layout == "tp":
        assert params["layers.mlp.up"].sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor")
    _, m = models.load(path, mesh, layout=layout)
    tokens = jax.device_put(jnp.asarray(IDS), sharding.Layout(mesh, layout).sharding(IDS.shape, ("batch", "seq")))
    out = np.asarray(qwen.forward(m, tokens, jnp.ones_like(tokens)))
    assert rel_err(out, torch_logits(ref_model, IDS)) <= 1e-4


@pytest.mark.parametrize("which", ["qwen2", "qwen3"])
def test_export_round_trip(tmp_path, which, qwen2_dir, qwen3_dir):
    import transformers
    path, ref_model = qwen2_dir if which == "qwen2" else qwen3_dir
    cfg, model = models.load(path)
    out_dir = hf_io.export(model, tmp_path / "export")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir).eval()
    assert type(reloaded) is type(ref_model)
    ref = torch_logits(ref_model, IDS)
    np.testing.assert_array_equal(torch_logits(reloaded, IDS), ref)
    assert hf_io.read_config(out_dir) == cfg
    np.testing.assert_array_equal(ours(out_dir), ours(path))
    with pytest.raises(FileExistsError, match="overwrite"):
        hf_io.export(model, out_dir)


def test_export_sharded_bfloat16(tmp_path, qwen3_dir):
    import torch
    import transformers
    path, ref_model = qwen3_dir
    _, model = models.load(path)
    out_dir = hf_io.export(model, tmp_path / "bf16", dtype="bfloat16", max_shard_bytes=20_000)
    assert (out_dir / "model.safetensors.index.json").exists()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
    assert reloaded.dtype == torch.bfloat16
    cfg_bf16, _ = models.load(out_dir)
    assert (cfg_bf16.dtype, cfg_bf16.param_dtype) == ("bfloat16", "float32")  # master weights f32
    ref = torch_logits(ref_model, IDS)
    assert rel_err(ours(out_dir), ref) < 0.05  # bfloat16 weights and compute, as stored


def test_export_of_sharded_model(tmp_path, qwen2_dir):
    path, _ = qwen2_dir
    _, model = models.load(path, sharding.make_mesh("fsdp=2,tensor=4"))
    out_dir = hf_io.export(model, tmp_path / "from_mesh")
    a, b = hf_io.checkpoint_tensors(path), hf_io.checkpoint_tensors(out_dir)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


# ----------------------------------------------------------------------------- bad inputs


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_config_that_does_not_match_tensors(tmp_path, qwen2_dir):
    path = _copy(qwen2_dir[0], tmp_path / "bad")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 128
    config["num_hidden_layers"] = 3
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(hf_io.CheckpointError, match="does not match its config.json") as e:
        models.load(path)
    msg = str(e.value)
    assert "mlp.gate_proj.weight: checkpoint (96, 64), config implies (128, 64)" in msg
    assert "layers.2" in msg  # the third layer the config promises is missing


def test_tied_config_with_untied_tensors_is_named(tmp_path, qwen3_dir):
    path = _copy(qwen3_dir[0], tmp_path / "bad")
    config = json.loads((path / "config.json").read_text())
    config["attention_bias"] = True
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(hf_io.CheckpointError, match="no tensor in the checkpoint.*q_bias"):
        models.load(path)


def test_missing_shard_file(tmp_path):
    build_hf_model(tmp_path, max_shard_size="40KB", **QWEN2_TINY)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(hf_io.CheckpointError, match=f"missing.*{victim.name}|{victim.name}.*missing"):
        models.load(tmp_path)


def test_unknown_model_type(tmp_path, qwen2_dir):
    path = _copy(qwen2_dir[0], tmp_path / "llama")
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "llama"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="Unsupported model_type 'llama'.*'qwen2'.*'qwen3'"):
        models.load(path)


def test_missing_files(tmp_path):
    with pytest.raises(hf_io.CheckpointError, match="no config.json"):
        models.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2_TINY, "model_type": "qwen2"}))
    with pytest.raises(hf_io.CheckpointError, match="No model.safetensors"):
        models.load(tmp_path)
    with pytest.raises(ValueError, match="neither a directory nor a preset"):
        models.load("qwen9_huge")


def test_unsupported_rope_type_is_named():
    with pytest.raises(ValueError, match="'dynamic' is not supported"):
        qwen.from_hf_config({**QWEN2_TINY, "rope_scaling": {"type": "dynamic", "factor": 2.0}})


def test_table_round_trips_every_parameter():
    for preset in ("tiny",):
        for untied in (False, True):
            cfg = qwen.PRESETS[preset].replace(tie_embeddings=not untied, qkv_bias=True, out_bias=True)
            _, state = __import__("flax").nnx.split(qwen.abstract_model(cfg))
            for stacked, var in hf_io._flat(state):
                for path, shape, _ in hf_io._per_layer(stacked, tuple(var.shape)):
                    rule, name = hf_io.ours_to_hf(path)
                    back = hf_io.hf_to_ours(name)
                    assert back is not None and back[1] == path
                    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
                    np.testing.assert_array_equal(rule.to_ours(rule.to_hf(a), shape), a)
