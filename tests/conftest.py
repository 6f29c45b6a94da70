"""Shared test setup: 8 fake CPU devices, tiny random HF checkpoints, the real Qwen3 tokenizer."""

import os

# Must happen before JAX initialises its backends.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
QWEN_TOKENIZER = ROOT / ".cache" / "qwen3_tokenizer"

# Small models covering what the parity tests must exercise (issue #2).
QWEN2_TINY = dict(model_type="qwen2", vocab_size=160, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,  # GQA 4:1
                  tie_word_embeddings=False, rope_theta=1e4)
QWEN3_TINY = dict(model_type="qwen3", vocab_size=160, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,  # GQA 2:1
                  head_dim=24, tie_word_embeddings=True, rope_theta=1e6)  # head_dim != 64/4


def build_hf_model(path, seed=0, max_shard_size=None, **config):
    """A random transformers Qwen2/Qwen3 model (every tensor random, biases and norms too), saved."""
    import torch
    import transformers

    config = dict(config)
    model_type = config.pop("model_type")
    cls_cfg, cls_model = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[model_type]
    torch.manual_seed(seed)
    model = cls_model(cls_cfg(**config)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:  # std 0.15 keeps logits far from uniform, so errors show
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, **kw)
    return model


def torch_logits(model, ids, attention_mask=None, position_ids=None):
    import torch
    with torch.no_grad():
        out = model(torch.as_tensor(ids), attention_mask=None if attention_mask is None
                    else torch.as_tensor(attention_mask),
                    position_ids=None if position_ids is None else torch.as_tensor(position_ids))
    return out.logits.float().numpy()


def layer_params(model, filter=None):
    """Parameters by their per-layer names ('layers.0.attn.q', 'embedding', ...): stacked layer
    parameters (leading L axis) are sliced per layer."""
    from flax import nnx
    out = {}
    for keys, var in nnx.state(model, filter or nnx.Param).flat_state():
        path, value = ".".join(map(str, keys)), var.get_value()
        if path.startswith("layers."):
            for i in range(value.shape[0]):
                out[f"layers.{i}.{path[len('layers.'):]}"] = value[i]
        else:
            out[path] = value
    return out


def rel_err(a, b):
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir():
    if not (QWEN_TOKENIZER / "tokenizer.json").exists():
        subprocess.run(["bash", str(ROOT / "run.sh"), "setup", "test"], check=True)
    return QWEN_TOKENIZER


def run_module(module, *args, env=None, check=True):
    """Run `python -m module args` in a fresh interpreter (its own JAX devices)."""
    full_env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=full_env, cwd=ROOT)
    if check and proc.returncode:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
