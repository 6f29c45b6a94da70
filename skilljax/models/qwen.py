"""Qwen2 / Qwen2.5 / Qwen3 decoder in Flax NNX.

Shape legend: B batch, T query positions, S key positions (cache length), D model, N query heads,
K kv heads, G = N // K query heads per kv head, H head dim, F mlp, V vocab.

The attention signature is KV-cache friendly: callers pass per-row `positions_BT` (RoPE), a boolean
`mask_BTS` (which keys each query sees) and optionally a cache with a scalar write index; the sampler
builds masks for left-padded prompts and decode steps, `forward` builds them for plain sequences.

Layers are stored stacked: every layer parameter has a leading L axis (logical axis `layers`) and
the cache is one [L, B, K, S, H] array per k and v. With `scan_layers` the forward pass is one
`lax.scan` over the layers (compile time independent of depth); without it a Python loop over the
same slices (one traced copy per layer). Both compute the same numbers.

Precision: `param_dtype` is the storage of the parameters (float32 master weights by default),
`dtype` the compute dtype every matmul casts to. `remat` picks what the backward pass keeps per
layer: "none", "full" (only the layer inputs; everything else recomputed) or "dots" (matmul outputs
kept, elementwise work recomputed).

LoRA (`lora_rank` > 0): each targeted projection W gets adapters A [in, r] and B [r, out] (B starts
at zero) and computes x W + (alpha / r) (x A) B; adapters are `LoRAParam`s, the only parameters
`trainable(cfg)` selects. `merged_state` folds them into W (sampler, HF export).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from skilljax import sharding as shd

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
SUPPORTED_ROPE = ("default", "linear", "yarn")
REMAT_POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class QwenConfig:
    vocab_size: int
    embed_dim: int
    mlp_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    model_type: str = "qwen3"  # "qwen2" (also Qwen2.5) or "qwen3"
    rope_theta: float = 1e6
    # Scaled RoPE as (("rope_type", "yarn"), ("factor", 4.0), ...); None for plain RoPE.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    # Multimodal RoPE (Qwen2-VL): how many of the head_dim / 2 frequencies follow the temporal,
    # height and width position rows, e.g. (16, 24, 24); None for 1-D RoPE. See `rope_tables`.
    mrope_section: tuple[int, ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = True
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"  # compute dtype
    remat: str = "none"  # REMAT_POLICIES; True/False are read as "full"/"none"
    scan_layers: bool = True
    # Queries attend in blocks of this many positions when a pass has more (and a multiple):
    # scores of one block at a time, [B, N, block, S], instead of [B, N, T, S]. 0 = never.
    attention_block: int = 512
    # Training log-probabilities project onto the vocabulary this many positions at a time
    # ([B, block, V] logits, recomputed in the backward pass; `rl.learner.token_logprobs`), so
    # the [B, T, V] logits of a long response never exist at once. 0 = all positions together.
    logits_block: int = 256
    lora_rank: int = 0  # 0: no adapters
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        if isinstance(self.remat, bool):
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r}; choose one of {tuple(REMAT_POLICIES)}.")
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        bad = sorted(set(self.lora_targets) - set(LORA_TARGETS))
        if bad or self.lora_rank < 0:
            raise ValueError(f"LoRA: rank must be >= 0 and targets among {LORA_TARGETS}; got rank "
                             f"{self.lora_rank}, unknown targets {bad}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads} (grouped-query attention).")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; choose one of {tuple(DTYPES)}.")
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
            if sum(self.mrope_section) != self.head_dim // 2:
                raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim / 2 = "
                                 f"{self.head_dim // 2} (one entry per rotary frequency).")
        kind = self.rope_scaling_dict.get("rope_type", "default")
        if kind not in SUPPORTED_ROPE:
            raise ValueError(
                f"RoPE scaling type {kind!r} is not supported (supported: {SUPPORTED_ROPE}); "
                "'dynamic' NTK scaling depends on the running sequence length and is not "
                "implemented. Remove rope_scaling from config.json to use plain RoPE within the "
                "pretraining context.")

    def replace(self, **kw) -> QwenConfig:
        return dataclasses.replace(self, **kw)

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling or ())

    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def num_params(self) -> int:
        d, h = self.embed_dim, self.head_dim
        attn = d * h * (2 * self.num_heads + 2 * self.num_kv_heads)
        attn += self.qkv_bias * h * (self.num_heads + 2 * self.num_kv_heads)
        attn += self.out_bias * d + self.qk_norm * 2 * h
        layer = attn + 3 * d * self.mlp_dim + 2 * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * layer + d + head


def _qwen2(**kw) -> QwenConfig:
    kw.setdefault("head_dim", kw["embed_dim"] // kw["num_heads"])
    return QwenConfig(model_type="qwen2", qkv_bias=True, qk_norm=False, bos_token_id=151643,
                      eos_token_ids=(151645,), **kw)


def _qwen3(**kw) -> QwenConfig:
    return QwenConfig(model_type="qwen3", qkv_bias=False, qk_norm=True, head_dim=128,
                      max_position_embeddings=40960, bos_token_id=151643, eos_token_ids=(151645,),
                      **kw)


# Sizes from the released config.json files of each checkpoint.
PRESETS: dict[str, QwenConfig] = {
    # ~0.4 M parameters: unit tests and the sampler benchmark's "tiny" case.
    "tiny": QwenConfig(vocab_size=512, embed_dim=128, mlp_dim=320, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=32, rope_theta=1e4, max_position_embeddings=2048),
    # ~40 M parameters: the benchmark's "small" case and CPU-scale experiments.
    "small": QwenConfig(vocab_size=32000, embed_dim=512, mlp_dim=1536, num_layers=8, num_heads=8,
                        num_kv_heads=4, head_dim=64, rope_theta=1e4, max_position_embeddings=4096),
    "qwen2p5_0p5b": _qwen2(vocab_size=151936, embed_dim=896, mlp_dim=4864, num_layers=24,
                           num_heads=14, num_kv_heads=2, tie_embeddings=True),
    "qwen2p5_1p5b": _qwen2(vocab_size=151936, embed_dim=1536, mlp_dim=8960, num_layers=28,
                           num_heads=12, num_kv_heads=2, tie_embeddings=True),
    "qwen2p5_3b": _qwen2(vocab_size=151936, embed_dim=2048, mlp_dim=11008, num_layers=36,
                         num_heads=16, num_kv_heads=2, tie_embeddings=True),
    "qwen2p5_7b": _qwen2(vocab_size=152064, embed_dim=3584, mlp_dim=18944, num_layers=28,
                         num_heads=28, num_kv_heads=4, tie_embeddings=False),
    "qwen3_0p6b": _qwen3(vocab_size=151936, embed_dim=1024, mlp_dim=3072, num_layers=28,
                         num_heads=16, num_kv_heads=8, tie_embeddings=True),
    "qwen3_1p7b": _qwen3(vocab_size=151936, embed_dim=2048, mlp_dim=6144, num_layers=28,
                         num_heads=16, num_kv_heads=8, tie_embeddings=True),
    "qwen3_4b": _qwen3(vocab_size=151936, embed_dim=2560, mlp_dim=9728, num_layers=36,
                       num_heads=32, num_kv_heads=8, tie_embeddings=True),
    "qwen3_8b": _qwen3(vocab_size=151936, embed_dim=4096, mlp_dim=12288, num_layers=36,
                       num_heads=32, num_kv_heads=8, tie_embeddings=False),
}


# ----------------------------------------------------------------------------- HF config.json


def from_hf_config(hf: Mapping[str, Any], **overrides) -> QwenConfig:
    """QwenConfig from a `config.json` dict (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
    model_type = hf.get("model_type")
    if model_type not in ("qwen2", "qwen3"):
        raise ValueError(
            f"Unsupported model_type {model_type!r} in config.json: skilljax.models.qwen handles "
            "'qwen2' (Qwen2, Qwen2.5) and 'qwen3' (dense Qwen3). MoE and VL checkpoints are not "
            "supported by this model class.")
    if hf.get("use_sliding_window"):
        raise ValueError("config.json sets use_sliding_window=true; sliding-window attention is not "
                         "implemented (no released Qwen2/2.5/3 dense checkpoint uses it).")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported (Qwen uses 'silu').")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    scaling = None if rope_type == "default" else tuple(sorted({"rope_type": rope_type, **rope}.items()))
    heads = hf["num_attention_heads"]
    is_qwen3 = model_type == "qwen3"
    eos = hf.get("eos_token_id")
    bias = bool(hf.get("attention_bias", False))
    stored = hf.get("dtype") or hf.get("torch_dtype")
    stored = stored if stored in DTYPES else "float32"
    kw = dict(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        mlp_dim=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=(hf.get("head_dim") if is_qwen3 else None) or hf["hidden_size"] // heads,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", not is_qwen3)),
        qkv_bias=bias if is_qwen3 else True,
        out_bias=bias if is_qwen3 else False,
        qk_norm=is_qwen3,
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        initializer_range=hf.get("initializer_range", 0.02),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        pad_token_id=hf.get("pad_token_id"),
        param_dtype="float32",  # master weights; compute as stored unless overridden
        dtype=stored,
    )
    kw.update(overrides)
    return QwenConfig(**kw)


def to_hf_config(cfg: QwenConfig, dtype: str | None = None) -> dict[str, Any]:
    """The config.json `transformers` reads for this model (Qwen2ForCausalLM / Qwen3ForCausalLM)."""
    is_qwen3 = cfg.model_type == "qwen3"
    if not is_qwen3:
        if cfg.head_dim * cfg.num_heads != cfg.embed_dim:
            raise ValueError("Qwen2 checkpoints require head_dim == embed_dim / num_heads; this config "
                             f"has head_dim={cfg.head_dim}, embed_dim={cfg.embed_dim}, "
                             f"num_heads={cfg.num_heads}. Use model_type='qwen3' for other head dims.")
        if cfg.qk_norm or not cfg.qkv_bias or cfg.out_bias:
            raise ValueError("Qwen2 checkpoints have q/k/v biases, no o_proj bias and no q/k norms.")
    elif cfg.qkv_bias != cfg.out_bias or not cfg.qk_norm:
        raise ValueError("Qwen3 checkpoints have q/k norms and one attention_bias flag for q/k/v/o.")
    eos = list(cfg.eos_token_ids)
    out = {
        "architectures": ["Qwen3ForCausalLM" if is_qwen3 else "Qwen2ForCausalLM"],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.embed_dim,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling_dict or None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "use_sliding_window": False,
        "use_cache": True,
        "attention_dropout": 0.0,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "dtype": dtype or cfg.param_dtype,
    }
    if cfg.pad_token_id is not None:
        out["pad_token_id"] = cfg.pad_token_id
    if is_qwen3:
        out["head_dim"] = cfg.head_dim
        out["attention_bias"] = cfg.qkv_bias
    return out


# ----------------------------------------------------------------------------- RoPE


def rope_inv_freq(cfg: QwenConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [H/2] and the cos/sin scale, for the config's RoPE type."""
    dim = cfg.head_dim
    base = cfg.rope_theta
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    p = cfg.rope_scaling_dict
    kind = p.get("rope_type", "default")
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / p["factor"], 1.0
    assert kind == "yarn", kind  # QwenConfig.__post_init__ rejects the others
    return _yarn(inv, dim, base, p, cfg.max_position_embeddings)


def _yarn(inv: np.ndarray, dim: int, base: float, p: Mapping[str, Any],
          max_pos: int) -> tuple[np.ndarray, float]:
    """YaRN (arXiv 2309.00071): interpolate low frequencies, keep high ones, scale attention."""
    original = p.get("original_max_position_embeddings") or max_pos
    factor = p.get("factor") or max_pos / original

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1 → extrapolate (original frequency), 0 → interpolate (divided by factor)
    return (inv / factor) * (1 - keep) + inv * keep, float(attention_factor)


class Rope(NamedTuple):
    cos_BT1H: jax.Array
    sin_BT1H: jax.Array


def rope_tables(cfg: QwenConfig, positions_BT: jax.Array) -> Rope:
    """cos/sin for every position, computed once per forward and shared by all layers.

    M-RoPE (Qwen2-VL, arXiv 2409.12191 §2.1): with `cfg.mrope_section` the positions may be
    [3, B, T] (temporal, height, width rows); frequency j then rotates by the row of the section
    it falls in (section i uses row i mod 3). Text tokens have three equal rows, which is 1-D RoPE,
    so [B, T] positions are accepted too."""
    inv_freq, scale = rope_inv_freq(cfg)
    if positions_BT.ndim == 3:
        if cfg.mrope_section is None:
            raise ValueError(f"Positions of shape {positions_BT.shape} are M-RoPE positions "
                             "[3, B, T], but the config has no mrope_section.")
        rows = np.repeat(np.arange(len(cfg.mrope_section)) % 3, cfg.mrope_section)
        positions_BTh = jnp.moveaxis(positions_BT[rows], 0, -1).astype(jnp.float32)
        freqs_BTh = positions_BTh * jnp.asarray(inv_freq)
    else:
        freqs_BTh = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)[:, :, None, :]
    return Rope(jnp.cos(angles) * scale, jnp.sin(angles) * scale)


def apply_rope(x_BTNH: jax.Array, rope: Rope) -> jax.Array:
    """Rotate-half RoPE as in the reference implementation, computed in float32."""
    cos, sin = rope
    x = x_BTNH.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x * cos + rotated * sin).astype(x_BTNH.dtype)


# ----------------------------------------------------------------------------- modules


CACHE_AXES = ("layers", "batch", "act_kv_heads", "seq", "head_dim")  # of each LayerCache array


class LayerCache(NamedTuple):
    """KV cache of every layer. Heads before positions: decode attention is then a plain batched
    matmul over (B, K)."""
    k_LBKSH: jax.Array
    v_LBKSH: jax.Array


class LoRAParam(nnx.Param):
    """A low-rank adapter weight: with LoRA on, the only trainable parameters."""


def trainable(cfg: QwenConfig):
    """The nnx filter of the parameters an optimizer updates: adapters with LoRA, else all."""
    return LoRAParam if cfg.lora_rank else nnx.Param


def _param(rngs: nnx.Rngs, shape, axes, std, dtype) -> nnx.Param:
    # Drawn in float32 so one seed gives the same weights (up to rounding) in every dtype.
    value = (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype)
    return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return y.astype(x.dtype) * self.scale[...].astype(x.dtype)


class LoRA(nnx.Module):
    """Adapters of one projection with weight [*in, *out]: A [*in, r] (random), B [r, *out] (0)."""

    def __init__(self, a: jax.Array, b: jax.Array, a_axes, b_axes, scale: float):
        self.a = LoRAParam(a, logical_axes=a_axes)
        self.b = LoRAParam(b, logical_axes=b_axes)
        self.scale = scale

    def __call__(self, x_BTI: jax.Array) -> jax.Array:
        """(x A) B · scale for x with the input dims flattened; output dims flattened."""
        dt = x_BTI.dtype
        r = self.a.shape[-1]
        a_IR = self.a[...].astype(dt).reshape(-1, r)
        b_RO = self.b[...].astype(dt).reshape(r, -1)
        return jnp.einsum("BTR,RO->BTO", jnp.einsum("BTI,IR->BTR", x_BTI, a_IR), b_RO) * self.scale


def _lora(module, name: str, x_BTI: jax.Array, y_BTO: jax.Array) -> jax.Array:
    lora = getattr(module, name + "_lora", None)
    return y_BTO if lora is None else y_BTO + lora(x_BTI)


def _project_in(x_BTD, w_DNH):
    """x @ w with the heads flattened: a plain 2-D matmul over contiguous weights (an einsum over
    (N, H) made XLA:CPU copy the weight into another layout at every decode step)."""
    d, n, h = w_DNH.shape
    return jnp.einsum("BTD,DF->BTF", x_BTD, w_DNH.reshape(d, n * h))


def _attend(q_BTKGH, segments, dt):
    """Grouped-query attention of T queries over key segments [(k_BKSH, v_BKSH, mask_BTS), ...]
    under one softmax (combined from per-segment maxima and sums, so the segments' scores are never
    concatenated): out [B, T, K, G, H]."""
    b, t, kv, g, h = q_BTKGH.shape
    # Decode with grouped queries (G > 1): multiply-and-reduce over (B, K, G, S, H) fuses into
    # one loop and beats a batched dot over B×K tiny matrices ~2× on XLA:CPU. With G = 1 the
    # same expression runs 20-50× slower than the dot (measured at B 8-64, S 80-1024).
    reduce = t == 1 and g > 1

    def scores(k_BKSH, mask_BTS):
        if reduce:
            q_BKGH = q_BTKGH[:, 0].astype(jnp.float32)
            logits_BKGTS = (jnp.sum(q_BKGH[:, :, :, None] * k_BKSH[:, :, None], axis=-1)
                            * (h ** -0.5))[:, :, :, None]
        else:
            logits_BKGTS = jnp.einsum("BTKGH,BKSH->BKGTS", q_BTKGH, k_BKSH,
                                      preferred_element_type=jnp.float32) * (h ** -0.5)
        return jnp.where(mask_BTS[:, None, None], logits_BKGTS, jnp.finfo(jnp.float32).min)

    def mix(probs_BKGTS, v_BKSH):
        if reduce:
            return jnp.sum(probs_BKGTS[:, :, :, 0, :, None] * v_BKSH[:, :, None], axis=-2)[:, None]
        return jnp.einsum("BKGTS,BKSH->BTKGH", probs_BKGTS, v_BKSH)

    if len(segments) == 1:
        k_BKSH, v_BKSH, mask_BTS = segments[0]
        return mix(jax.nn.softmax(scores(k_BKSH, mask_BTS), axis=-1).astype(dt), v_BKSH)
    logits = [scores(k, m) for k, _, m in segments]
    top_BKGT1 = jax.lax.stop_gradient(
        functools.reduce(jnp.maximum, [jnp.max(x, axis=-1, keepdims=True) for x in logits]))
    weights = [jnp.exp(x - top_BKGT1) for x in logits]
    total_BKGT1 = sum(jnp.sum(w, axis=-1, keepdims=True) for w in weights)
    out_BTKGH = sum(mix((w / total_BKGT1).astype(dt), v) for w, (_, v, _) in zip(weights, segments))
    return out_BTKGH


class Attention(nnx.Module):
    def __init__(self, cfg: QwenConfig, layout: shd.Layout | None, *, rngs: nnx.Rngs):
        pd, std = DTYPES[cfg.param_dtype], cfg.initializer_range
        d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg, self.layout = cfg, layout
        self.q = _param(rngs, (d, n, h), ("embed", "heads", "head_dim"), std, pd)
        self.k = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), std, pd)
        self.v = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), std, pd)
        self.o = _param(rngs, (n, h, d), ("heads", "head_dim", "embed"), std, pd)
        if cfg.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((n, h), pd), logical_axes=("heads", "head_dim"))
            self.k_bias = nnx.Param(jnp.zeros((k, h), pd), logical_axes=("kv_heads", "head_dim"))
            self.v_bias = nnx.Param(jnp.zeros((k, h), pd), logical_axes=("kv_heads", "head_dim"))
        if cfg.out_bias:
            self.o_bias = nnx.Param(jnp.zeros((d,), pd), logical_axes=("norm",))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(h, cfg.rms_norm_eps, param_dtype=pd)
            self.k_norm = RMSNorm(h, cfg.rms_norm_eps, param_dtype=pd)

    def __call__(self, x_BTD, rope: Rope, mask_BTS, cache: tuple | None, cache_index):
        """Self-attention; with `cache` = this layer's (k_BKSH, v_BKSH) as they were before this
        pass, the queries also see the cached keys at slots < `cache_index` (`mask_BTS` indexes
        slots: this pass's tokens sit at cache_index, cache_index + 1, ...). Returns the output
        and this pass's keys and values (k_BKTH, v_BKTH), which the caller writes to the cache:
        the cache is only read here, so the decode loop updates it in place without a copy.
        `cache_index` 0 as a Python int (a prefill) skips the empty cache."""
        cfg, dt = self.cfg, DTYPES[self.cfg.dtype]
        b, t, _ = x_BTD.shape
        n, kv, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

        def project(name, heads):
            y_BTF = _lora(self, name, x_BTD, _project_in(x_BTD, getattr(self, name)[...].astype(dt)))
            y_BTNH = y_BTF.reshape(b, t, heads, h)
            if cfg.qkv_bias:
                y_BTNH += getattr(self, name + "_bias")[...].astype(dt)
            return y_BTNH

        q_BTNH, k_BTKH, v_BTKH = project("q", n), project("k", kv), project("v", kv)
        if cfg.qk_norm:
            q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
        q_BTNH, k_BTKH = apply_rope(q_BTNH, rope), apply_rope(k_BTKH, rope)
        q_BTNH = shd.constrain(q_BTNH, ("batch", "seq", "act_heads", "head_dim"), self.layout)
        k_BKTH, v_BKTH = k_BTKH.transpose(0, 2, 1, 3), v_BTKH.transpose(0, 2, 1, 3)
        if cache is not None:  # cached dtype: what later passes will read back
            k_BKTH, v_BKTH = k_BKTH.astype(cache[0].dtype), v_BKTH.astype(cache[1].dtype)

        own_mask_BTT = mask_BTS
        segments = []
        if cache is not None:
            own_mask_BTT = jax.lax.dynamic_slice_in_dim(mask_BTS, cache_index, t, axis=2)
            if not (isinstance(cache_index, int) and cache_index == 0):
                old_mask_BTS = mask_BTS & (jnp.arange(mask_BTS.shape[-1]) < cache_index)
                segments.append((cache[0].astype(dt), cache[1].astype(dt), old_mask_BTS))
        q_BTKGH = q_BTNH.reshape(b, t, kv, n // kv, h)
        own = (k_BKTH.astype(dt), v_BKTH.astype(dt))
        block = cfg.attention_block
        if block and t > block and t % block == 0 and not segments:
            # One query block at a time (recomputed in the backward pass): the [.., T, S] scores
            # of a long prefill or training sequence never exist at once.
            nb = t // block
            split = lambda x: x.reshape(b, nb, block, *x.shape[2:]).swapaxes(0, 1)
            attend = jax.checkpoint(lambda xs: _attend(xs[0], [(*own, xs[1])], dt))
            out_BTKGH = jax.lax.map(attend, (split(q_BTKGH), split(own_mask_BTT)))
            out_BTKGH = out_BTKGH.swapaxes(0, 1).reshape(b, t, kv, n // kv, h)
        else:
            out_BTKGH = _attend(q_BTKGH, segments + [(*own, own_mask_BTT)], dt)
        out_BTF = out_BTKGH.reshape(b, t, n * h)
        o_FD = self.o[...].astype(dt).reshape(n * h, -1)
        y_BTD = _lora(self, "o", out_BTF, jnp.einsum("BTF,FD->BTD", out_BTF, o_FD))
        if cfg.out_bias:
            y_BTD += self.o_bias[...].astype(dt)
        return y_BTD, (None if cache is None else (k_BKTH, v_BKTH))


class MLP(nnx.Module):
    def __init__(self, cfg: QwenConfig, layout: shd.Layout | None, *, rngs: nnx.Rngs):
        pd, std = DTYPES[cfg.param_dtype], cfg.initializer_range
        d, f = cfg.embed_dim, cfg.mlp_dim
        self.gate = _param(rngs, (d, f), ("embed", "mlp"), std, pd)
        self.up = _param(rngs, (d, f), ("embed", "mlp"), std, pd)
        self.down = _param(rngs, (f, d), ("mlp", "embed"), std, pd)
        self.dtype, self.layout = DTYPES[cfg.dtype], layout

    def __call__(self, x_BTD):
        dt = self.dtype
        proj = lambda name, x, eq: _lora(self, name, x, jnp.einsum(eq, x, getattr(self, name)[...].astype(dt)))
        gate_BTF = proj("gate", x_BTD, "BTD,DF->BTF")
        up_BTF = proj("up", x_BTD, "BTD,DF->BTF")
        h_BTF = shd.constrain(jax.nn.silu(gate_BTF) * up_BTF, ("batch", "seq", "act_mlp"), self.layout)
        return proj("down", h_BTF, "BTF,FD->BTD")


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: QwenConfig, layout: shd.Layout | None, *, rngs: nnx.Rngs):
        pd = DTYPES[cfg.param_dtype]
        self.attn_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps, param_dtype=pd)
        self.attn = Attention(cfg, layout, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps, param_dtype=pd)
        self.mlp = MLP(cfg, layout, rngs=rngs)
        self.layout = layout

    def __call__(self, x_BTD, rope, mask_BTS, cache, cache_index):
        y_BTD, new_kv = self.attn(self.attn_norm(x_BTD), rope, mask_BTS, cache, cache_index)
        x_BTD = x_BTD + y_BTD
        x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD))
        return shd.constrain(x_BTD, ("batch", "seq", "act_embed"), self.layout), new_kv


def _stacked(modules: list[nnx.Module]) -> nnx.Module:
    """One module whose every variable is the stack of the modules' ones (leading axis `layers`)."""
    def stack(*vs):
        axes = ("layers",) + tuple(vs[0].get_metadata()["logical_axes"])
        return vs[0].replace(jnp.stack([v.get_value() for v in vs]), logical_axes=axes)
    is_var = lambda x: isinstance(x, nnx.Variable)
    states = [nnx.state(m) for m in modules]
    return nnx.merge(nnx.graphdef(modules[0]), jax.tree.map(stack, *states, is_leaf=is_var))


def _lora_shapes(cfg: QwenConfig) -> dict[str, tuple[str, tuple, tuple, tuple, tuple]]:
    """target → (submodule, in shape, out shape, in axes, out axes) of its weight."""
    d, n, k, h, f = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    return {
        "q": ("attn", (d,), (n, h), ("embed",), ("heads", "head_dim")),
        "k": ("attn", (d,), (k, h), ("embed",), ("kv_heads", "head_dim")),
        "v": ("attn", (d,), (k, h), ("embed",), ("kv_heads", "head_dim")),
        "o": ("attn", (n, h), (d,), ("heads", "head_dim"), ("embed",)),
        "gate": ("mlp", (d,), (f,), ("embed",), ("mlp",)),
        "up": ("mlp", (d,), (f,), ("embed",), ("mlp",)),
        "down": ("mlp", (f,), (d,), ("mlp",), ("embed",)),
    }


class Qwen(nnx.Module):
    """Decoder-only causal LM. `__call__` returns float32 logits and the updated cache."""

    def __init__(self, cfg: QwenConfig, layout: shd.Layout | None = None, *, rngs: nnx.Rngs):
        pd, std = DTYPES[cfg.param_dtype], cfg.initializer_range
        self.cfg, self.layout = cfg, layout
        self.embedding = _param(rngs, (cfg.vocab_size, cfg.embed_dim), ("vocab", "embed"), std, pd)
        # Drawn layer by layer, then stacked: the same weights for one seed with and without
        # scanning (and as before layers were stacked).
        self.layers = _stacked([DecoderLayer(cfg, layout, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps, param_dtype=pd)
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, (cfg.embed_dim, cfg.vocab_size), ("embed", "vocab"), std, pd)
        if cfg.lora_rank:  # drawn last: the base weights do not depend on the adapters
            r, L = cfg.lora_rank, cfg.num_layers
            for target in cfg.lora_targets:
                sub, in_shape, out_shape, in_axes, out_axes = _lora_shapes(cfg)[target]
                fan_in = math.prod(in_shape)
                a = jax.random.normal(rngs.params(), (L, *in_shape, r), jnp.float32) * fan_in ** -0.5
                lora = LoRA(a, jnp.zeros((L, r, *out_shape), jnp.float32),
                            ("layers", *in_axes, "lora"), ("layers", "lora", *out_axes),
                            cfg.lora_scale)
                setattr(getattr(self.layers, sub), target + "_lora", lora)

    def embed(self, tokens_BT) -> jax.Array:
        x_BTD = jnp.take(self.embedding[...], tokens_BT, axis=0).astype(DTYPES[self.cfg.dtype])
        return shd.constrain(x_BTD, ("batch", "seq", "act_embed"), self.layout)

    def hidden(self, tokens_BT, positions_BT, mask_BTS, cache: LayerCache | None = None,
               cache_index=None):
        """Final-normed hidden states [B, T, D] and the updated cache."""
        return self.hidden_from_embeds(self.embed(tokens_BT), positions_BT, mask_BTS, cache,
                                       cache_index)

    def hidden_from_embeds(self, x_BTD, positions_BT, mask_BTS, cache: LayerCache | None = None,
                           cache_index=None):
        """`hidden` from input embeddings [B, T, D] (the VL model's carry image features);
        `positions_BT` may be M-RoPE positions [3, B, T] (see `rope_tables`)."""
        cfg = self.cfg
        rope = rope_tables(cfg, positions_BT)
        graphdef, layers = nnx.split(self.layers)

        def run(x_BTD, layer_state, layer_cache):
            return nnx.merge(graphdef, layer_state)(x_BTD, rope, mask_BTS, layer_cache, cache_index)

        if cfg.remat != "none" and cache is None:  # remat matters only under differentiation
            run = jax.checkpoint(run, policy=REMAT_POLICIES[cfg.remat], prevent_cse=False)
        if cfg.scan_layers:  # each layer reads its cache slice; its new keys and values come out
            def body(x_BTD, xs):
                layer_state, layer_cache = xs
                return run(x_BTD, layer_state, layer_cache)
            x_BTD, new_kv = jax.lax.scan(body, x_BTD, (layers, None if cache is None else tuple(cache)))
        else:
            outs = []
            for i in range(cfg.num_layers):
                x_BTD, kv = run(x_BTD, jax.tree.map(lambda a: a[i], layers),
                                None if cache is None else (cache.k_LBKSH[i], cache.v_LBKSH[i]))
                outs.append(kv)
            new_kv = None if cache is None else jax.tree.map(lambda *a: jnp.stack(a), *outs)
        if cache is not None:  # one write of every layer's new entries, after all reads
            start = (0, 0, 0, jnp.asarray(cache_index, jnp.int32), 0)
            cache = LayerCache(*(jax.lax.dynamic_update_slice(buf, new, start)
                                 for buf, new in zip(cache, new_kv)))
        return self.final_norm(x_BTD), cache

    def logits(self, h_BTD) -> jax.Array:
        dt = DTYPES[self.cfg.dtype]
        if self.cfg.tie_embeddings:
            out = jnp.einsum("BTD,VD->BTV", h_BTD, self.embedding[...].astype(dt),
                             preferred_element_type=jnp.float32)
        else:
            out = jnp.einsum("BTD,DV->BTV", h_BTD, self.lm_head[...].astype(dt),
                             preferred_element_type=jnp.float32)
        return shd.constrain(out, ("batch", "seq", "act_vocab"), self.layout)

    def __call__(self, tokens_BT, positions_BT, mask_BTS, cache=None, cache_index=None):
        h_BTD, cache = self.hidden(tokens_BT, positions_BT, mask_BTS, cache, cache_index)
        return self.logits(h_BTD), cache

    def init_cache(self, batch: int, length: int, dtype=None) -> LayerCache:
        return init_cache(self.cfg, self.layout, batch, length, dtype)


def init_cache(cfg: QwenConfig, layout: shd.Layout | None, batch: int, length: int,
               dtype=None) -> LayerCache:
    """A zero KV cache for every layer, created in place in its sharding."""
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)
    dtype = dtype or DTYPES[cfg.dtype]
    sharding = None if layout is None else layout.sharding(shape, CACHE_AXES)
    zeros = _zeros_fn(shape, jnp.dtype(dtype), sharding)
    return LayerCache(zeros(), zeros())


@functools.lru_cache(maxsize=64)
def _zeros_fn(shape, dtype, sharding):
    """A jitted maker of zeros born in `sharding`, compiled once per (shape, dtype, sharding)."""
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


def positions_from_mask(mask_BT: jax.Array) -> jax.Array:
    """Per-row positions for left-padded input: 0 at each row's first real token."""
    return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


def causal_mask(mask_BT: jax.Array) -> jax.Array:
    """[B, T, T] attention mask: causal and blind to padding keys."""
    t = mask_BT.shape[-1]
    causal_TT = jnp.tril(jnp.ones((t, t), bool))
    return causal_TT[None] & mask_BT.astype(bool)[:, None, :]


def sequence_logits(model: Qwen, tokens_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
    """Float32 logits [B, T, V] of plain (left- or right-padded) sequences, no cache."""
    logits_BTV, _ = model(tokens_BT, positions_from_mask(mask_BT), causal_mask(mask_BT))
    return logits_BTV


forward = nnx.jit(sequence_logits)


def abstract_model(cfg: QwenConfig, layout: shd.Layout | None = None, model_cls=None) -> Qwen:
    """The model with ShapeDtypeStruct leaves: shapes and metadata, no memory. `model_cls`: a
    subclass of Qwen to build instead (qwen_vl.QwenVL)."""
    return nnx.eval_shape(lambda: (model_cls or Qwen)(cfg, layout, rngs=nnx.Rngs(0)))


def create(cfg: QwenConfig, layout: shd.Layout | None = None, seed: int = 0,
           model_cls=None) -> Qwen:
    """A randomly initialised model whose parameters are born sharded (never whole on one device)."""
    graphdef, abstract_state = nnx.split(abstract_model(cfg, layout, model_cls))
    out_shardings = None if layout is None else shd.state_shardings(abstract_state, layout)
    init = jax.jit(lambda: nnx.state((model_cls or Qwen)(cfg, layout, rngs=nnx.Rngs(seed))),
                   out_shardings=out_shardings)
    return nnx.merge(graphdef, init())


# ----------------------------------------------------------------------------- LoRA


def create_adapters(cfg: QwenConfig, layout: shd.Layout | None = None, seed: int = 0
                    ) -> dict[str, jax.Array]:
    """The LoRA adapters `create(cfg, layout, seed)` would hold ('.'-joined path → array), without
    materialising the base weights (XLA drops their unused initialisation)."""
    _, abstract = nnx.split(abstract_model(cfg, layout), LoRAParam, ...)[:2]
    shardings = None if layout is None else shd.state_shardings(abstract, layout)
    init = jax.jit(lambda: nnx.state(Qwen(cfg, layout, rngs=nnx.Rngs(seed)), LoRAParam),
                   out_shardings=shardings)
    return {".".join(map(str, k)): v.get_value() for k, v in init().flat_state()}


def merged_state(model: Qwen, dtype=None) -> dict:
    """The parameters of the plain model (no adapters) equal to `model`: each adapted weight
    becomes W + scale · A B, as a pure dict for `nnx.merge(graphdef of cfg.replace(lora_rank=0))`,
    every float cast to `dtype` when given. Traceable (the sampler jits it)."""
    cfg = model.cfg
    pure = nnx.state(model, nnx.Param).to_pure_dict()
    layers = pure["layers"]
    for target in (cfg.lora_targets if cfg.lora_rank else ()):
        sub = _lora_shapes(cfg)[target][0]
        lora = layers[sub].pop(target + "_lora")
        w = layers[sub][target]
        L, r = cfg.num_layers, cfg.lora_rank
        delta = jnp.einsum("LIR,LRO->LIO", lora["a"].astype(jnp.float32).reshape(L, -1, r),
                           lora["b"].astype(jnp.float32).reshape(L, r, -1))
        layers[sub][target] = (w.astype(jnp.float32) + cfg.lora_scale * delta.reshape(w.shape)
                               ).astype(w.dtype)
    if dtype is not None:
        pure = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                            else x, pure)
    return pure
