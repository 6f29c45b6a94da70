"""The decoder itself: presets, initialisation, KV cache, remat, dtypes, sharded creation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from skilljax import models, sharding
from skilljax.models import qwen
from tests.conftest import layer_params, rel_err


def params(model):
    return layer_params(model)


def test_preset_sizes_match_released_models():
    # Parameter counts of the released checkpoints (billions, as in their model cards).
    expected = {"qwen2p5_0p5b": 0.494, "qwen2p5_1p5b": 1.544, "qwen2p5_3b": 3.086,
                "qwen2p5_7b": 7.616, "qwen3_0p6b": 0.596, "qwen3_1p7b": 1.721,
                "qwen3_4b": 4.022, "qwen3_8b": 8.191}
    for name, billions in expected.items():
        assert qwen.PRESETS[name].num_params() / 1e9 == pytest.approx(billions, rel=2e-3), name
    assert 0.35e6 < qwen.PRESETS["tiny"].num_params() < 0.45e6
    assert 38e6 < qwen.PRESETS["small"].num_params() < 45e6


def test_init_is_normal_with_initializer_range():
    cfg, model = models.load("tiny")
    p = params(model)
    assert sum(a.size for a in p.values()) == cfg.num_params()
    for name, a in p.items():
        if name.endswith("scale"):
            np.testing.assert_array_equal(a, 1.0)
        else:  # every matrix is random normal with the reference's std, none is zero
            assert float(jnp.std(a)) == pytest.approx(cfg.initializer_range, rel=0.1), name
            assert abs(float(jnp.mean(a))) < 0.1 * cfg.initializer_range, name


def test_seed_changes_weights():
    _, a = models.load("tiny", seed=0)
    _, b = models.load("tiny", seed=1)
    assert not np.allclose(params(a)["layers.0.mlp.up"], params(b)["layers.0.mlp.up"])


@pytest.mark.parametrize("block", [0, 4])  # 4: the 8-token prefill attends in two query blocks
def test_kv_cache_prefill_then_decode_equals_full_forward(block):
    cfg, model = models.load("tiny", remat=False, attention_block=block)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 10)))
    mask = jnp.ones_like(tokens).at[1, :3].set(0)  # row 1 left-padded
    full = qwen.forward(model, tokens, mask)

    s = 16  # cache longer than the sequence
    positions = qwen.positions_from_mask(mask)
    valid_S = jnp.zeros((2, s), bool).at[:, :10].set(mask.astype(bool))
    cache = model.init_cache(2, s)
    call = nnx.jit(lambda m, *args: m(*args))
    t0 = 8
    causal = jnp.arange(s)[None, None, :] <= jnp.arange(t0)[None, :, None]
    logits, cache = call(model, tokens[:, :t0], positions[:, :t0], causal & valid_S[:, None, :],
                         cache, jnp.int32(0))
    steps = [logits]
    for t in range(t0, 10):  # one compile: the write index is traced
        step_mask = (jnp.arange(s) <= t)[None, None, :] & valid_S[:, None, :]
        logits, cache = call(model, tokens[:, t:t + 1], positions[:, t:t + 1], step_mask, cache,
                             jnp.int32(t))
        steps.append(logits)
    cached = jnp.concatenate(steps, axis=1)
    real = np.asarray(mask, bool)
    assert rel_err(np.asarray(cached)[real], np.asarray(full)[real]) <= 1e-5


@pytest.mark.parametrize("variant", [
    dict(remat="full"), pytest.param(dict(remat="dots"), marks=pytest.mark.slow),
    pytest.param(dict(attention_block=2), marks=pytest.mark.slow), dict(scan_layers=False),
    pytest.param(dict(scan_layers=False, remat="full"), marks=pytest.mark.slow)])
def test_scan_and_remat_same_values_and_grads(variant):
    """Scanned vs unrolled layers and every remat policy compute the same loss and gradients."""
    _, plain = models.load("tiny", attention_block=0)  # scanned, no remat, one attention block
    _, other = models.load("tiny", **{"attention_block": 0, **variant})
    assert plain.cfg.scan_layers and other.cfg.replace(**variant) == other.cfg
    tokens = jnp.asarray([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])

    def loss(model):
        return jnp.mean(qwen.forward(model, tokens, jnp.ones_like(tokens)) ** 2)

    grad = nnx.jit(nnx.value_and_grad(loss))
    l1, g1 = grad(plain)
    l2, g2 = grad(other)
    assert float(l1) == pytest.approx(float(l2), rel=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(a).max()))


def test_remat_policy_is_validated_and_bools_still_read():
    assert qwen.PRESETS["tiny"].replace(remat=True).remat == "full"
    assert qwen.PRESETS["tiny"].replace(remat=False).remat == "none"
    with pytest.raises(ValueError, match="remat='everything'"):
        qwen.PRESETS["tiny"].replace(remat="everything")


def test_scanned_compile_does_not_grow_with_depth():
    """The scanned forward's HLO is the same size for 2 and 8 layers; the unrolled one grows."""
    def hlo_size(**kw):
        model = qwen.abstract_model(qwen.PRESETS["tiny"].replace(**kw))
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        lowered = nnx.jit(qwen.sequence_logits).lower(model, tokens, tokens)
        return len(lowered.as_text())
    assert hlo_size(num_layers=8) == hlo_size(num_layers=2)
    assert hlo_size(num_layers=8, scan_layers=False) > 3 * hlo_size(num_layers=2, scan_layers=False)


def test_bfloat16_close_to_float32():
    _, f32 = models.load("tiny")
    _, bf16 = models.load("tiny", dtype="bfloat16")  # compute only: master weights stay float32
    assert params(bf16)["layers.0.attn.q"].dtype == jnp.float32
    assert params(models.load("tiny", dtype="bfloat16", param_dtype="bfloat16")[1]
                  )["layers.0.attn.q"].dtype == jnp.bfloat16
    tokens = jnp.asarray([[7, 8, 9, 10, 11]])
    a = qwen.forward(f32, tokens, jnp.ones_like(tokens))
    b = qwen.forward(bf16, tokens, jnp.ones_like(tokens))
    assert b.dtype == jnp.float32  # logits are always float32
    assert rel_err(b, a) < 0.05


@pytest.mark.parametrize("layout,mesh_spec", [("fsdp", "fsdp=8"), ("tp", "data=2,tensor=4"),
                                              ("fsdp_tp", "fsdp=4,tensor=2")])
def test_created_sharded_equals_single_device(layout, mesh_spec):
    _, single = models.load("tiny")
    _, sharded = models.load("tiny", sharding.make_mesh(mesh_spec), layout=layout)
    ps, pm = params(single), params(sharded)
    for name in ("layers.0.attn.q", "layers.1.mlp.down", "embedding"):
        assert sharding.is_split(pm[name]), (layout, name, pm[name].sharding)
    for name in ps:
        np.testing.assert_array_equal(np.asarray(ps[name]), np.asarray(pm[name]))


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        qwen.PRESETS["tiny"].replace(num_kv_heads=3)
    with pytest.raises(ValueError, match="float64"):
        qwen.PRESETS["tiny"].replace(dtype="float64")
    with pytest.raises(ValueError, match="sliding"):
        qwen.from_hf_config({"model_type": "qwen2", "use_sliding_window": True})
    with pytest.raises(ValueError, match="Unsupported model_type 'qwen3_moe'"):
        qwen.from_hf_config({"model_type": "qwen3_moe"})
