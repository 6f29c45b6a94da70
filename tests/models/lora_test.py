"""LoRA: only adapters train, the sampler and the HF export use W + (alpha / r) A B."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from skilljax import models
from skilljax.models import hf_io, qwen
from skilljax.rl.learner import Learner, LearnerConfig
from skilljax.sampling import Sampler, SamplingParams
from tests.conftest import QWEN2_TINY, build_hf_model, layer_params, rel_err
from tests.rl.learner_test import random_batch

IDS = np.array([[3, 17, 42, 99, 5, 150, 7, 64]])


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    return path, build_hf_model(path, **QWEN2_TINY)


def randomise_b(model, seed=1):
    """Adapters start with B = 0 (the base model); give B values so the adapters matter."""
    state = nnx.state(model, qwen.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    for path, var in state.flat_state():
        if path[-1] == "b":
            var.set_value(0.05 * jax.random.normal(next(keys), var.shape, var.dtype))
    nnx.update(model, state)


def test_adapters_start_at_the_base_model_and_are_all_that_train():
    _, base = models.load("tiny", seed=0)
    _, model = models.load("tiny", seed=0, lora_rank=4, lora_alpha=8.0)
    tokens = jnp.asarray(IDS)
    np.testing.assert_array_equal(qwen.forward(model, tokens, jnp.ones_like(tokens)),
                                  qwen.forward(base, tokens, jnp.ones_like(tokens)))
    before_base = layer_params(base)
    adapters_before = {k: np.asarray(v) for k, v in layer_params(model, qwen.LoRAParam).items()}
    assert len(adapters_before) == 2 * len(qwen.LORA_TARGETS) * model.cfg.num_layers
    learner = Learner(model, LearnerConfig(learning_rate=1e-2, recompute_old_logp=False))
    # The optimizer holds state for the adapters only.
    opt_sizes = sum(x.size for x in jax.tree.leaves(nnx.state(learner.optimizer))
                    if hasattr(x, "size") and x.size > 1)
    adapter_size = sum(a.size for a in adapters_before.values())
    assert opt_sizes == 2 * adapter_size  # AdamW's two moments
    learner.update(random_batch(vocab=model.cfg.vocab_size))
    after = layer_params(model)
    for name, value in before_base.items():  # every base weight exactly as it was
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    adapters_after = layer_params(model, qwen.LoRAParam)
    for k, value in adapters_before.items():  # B = 0 gives A no gradient at the first step
        if k.endswith(".b"):
            assert not np.array_equal(adapters_after[k], value), k


def test_sampler_uses_merged_weights(tmp_path):
    _, model = models.load("tiny", seed=0, lora_rank=2)
    randomise_b(model)
    out_dir = hf_io.export(model, tmp_path / "merged")
    _, merged = models.load(out_dir)
    assert merged.cfg.lora_rank == 0
    prompts, params = [[1, 2, 3], [9, 8, 7, 6]], SamplingParams(max_new_tokens=6, temperature=0)
    a = Sampler(model).generate(prompts, params, jax.random.key(0))
    b = Sampler(merged).generate(prompts, params, jax.random.key(0))
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(np.concatenate(a.logprobs), np.concatenate(b.logprobs), atol=1e-5)


def test_merged_export_is_base_plus_scaled_ab_and_transformers_agrees(tmp_path, qwen2_dir):
    import torch
    import transformers
    path, _ = qwen2_dir
    cfg, model = models.load(path, lora_rank=4, lora_alpha=16.0, seed=3)
    randomise_b(model)
    out_dir = hf_io.export(model, tmp_path / "export")
    assert "lora" not in json.dumps(json.loads((out_dir / "config.json").read_text()))
    base, exported = hf_io.checkpoint_tensors(path), hf_io.checkpoint_tensors(out_dir)
    assert sorted(base) == sorted(exported)
    lora = layer_params(model, qwen.LoRAParam)
    for layer in range(cfg.num_layers):  # HF stores [out, in]; ours A [in, r], B [r, out]
        for target, hf_name in (("attn.q", "self_attn.q_proj"), ("mlp.down", "mlp.down_proj")):
            a = np.asarray(lora[f"layers.{layer}.{target}_lora.a"]).reshape(-1, 4)
            b = np.asarray(lora[f"layers.{layer}.{target}_lora.b"]).reshape(4, -1)
            name = f"model.layers.{layer}.{hf_name}.weight"
            np.testing.assert_allclose(exported[name], base[name] + (16.0 / 4) * (a @ b).T,
                                       rtol=1e-5, atol=1e-6)
    ours = np.asarray(qwen.forward(model, jnp.asarray(IDS), jnp.ones_like(jnp.asarray(IDS))))
    ref = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    with torch.no_grad():
        theirs = ref(torch.tensor(IDS)).logits.numpy()
    assert rel_err(ours, theirs) <= 1e-4
    assert not np.allclose(exported["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])


def test_bad_lora_settings_are_named():
    with pytest.raises(ValueError, match="unknown targets \\['qkv'\\]"):
        qwen.PRESETS["tiny"].replace(lora_rank=4, lora_targets=("qkv",))
