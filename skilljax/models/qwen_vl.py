"""Qwen2.5-VL in Flax NNX: a vision tower whose merged patch features replace the image-pad
tokens of a Qwen2 decoder that rotates with multimodal RoPE (arXiv 2502.13923, 2409.12191).

Shape legend: as qwen.py (B, T, S, D, N, H, F, V), plus P (and Q, as keys) patches of all images
together, U = P / m² merge units (one image-pad token each, m the spatial merge size), K = C·T·P·P
pixel values of one patch, L vision blocks.

The decoder is `qwen.Qwen` itself (QwenVL subclasses it: the text parameters, KV cache, LoRA and
HF table rows are the text model's); only its positions differ: [3, B, T] temporal / height /
width rows (`rope_index`), which `qwen.rope_tables` turns into M-RoPE tables.

The vision tower (Qwen2.5-VL ViT): a 3-D patch embedding (temporal patch 2; a still image is
two equal frames), L blocks of RMSNorm → attention with 2-D RoPE → RMSNorm → SwiGLU MLP, then an
RMSNorm and a two-layer GELU MLP over each 2 × 2 block of patches (the merger). Blocks attend
within windows of `window_size` pixels except those in `fullatt_block_indexes`, which attend over
the whole frame. The patch order, windows and 2-D positions depend only on `grid_thw` and are
built on the host (`vision_inputs`) as index arrays: the jitted tower compiles once per number of
patches, whatever the image sizes. Attention is masked over all patches at once (windows and
frames as segment ids), which equals HF's per-window attention; its scores are [N, P, P] per
block, fine for history images of a few thousand patches (the place to block it if images grow).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from skilljax import sharding as shd
from skilljax.models import qwen, vl_image
from skilljax.models.qwen import DTYPES, REMAT_POLICIES, QwenConfig, _param

VISION_RMS_EPS = 1e-6  # fixed in the reference implementation


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int = 32
    embed_dim: int = 1280
    mlp_dim: int = 3420
    num_heads: int = 16
    out_dim: int = 2048  # the decoder's embed_dim
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112  # pixels
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    tokens_per_second: int = 2  # videos only; kept for the config round trip
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    def __post_init__(self):
        object.__setattr__(self, "fullatt_block_indexes", tuple(self.fullatt_block_indexes))
        if self.embed_dim % self.num_heads or (self.embed_dim // self.num_heads) % 4:
            raise ValueError(f"Vision embed_dim {self.embed_dim} / num_heads {self.num_heads} must "
                             "be a head dim divisible by 4 (2-D RoPE: height and width halves).")
        if self.merger_window < 1:
            raise ValueError(f"window_size {self.window_size} px is smaller than one merge block "
                             f"({self.spatial_merge_size * self.patch_size} px).")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def merger_window(self) -> int:
        """Window side in merge blocks."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def num_params(self) -> int:
        d, f, u = self.embed_dim, self.mlp_dim, self.embed_dim * self.spatial_merge_size ** 2
        block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (3 * d * f + 2 * f + d)
        merger = d + (u * u + u) + (u * self.out_dim + self.out_dim)
        return self.patch_dim * d + self.depth * block + merger


@dataclasses.dataclass(frozen=True)
class QwenVLConfig(QwenConfig):
    """The decoder's QwenConfig (model_type qwen2, with `mrope_section`) plus the vision tower."""
    vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self):
        if self.mrope_section is None:
            object.__setattr__(self, "mrope_section", (16, 24, 24))  # HF's default
        super().__post_init__()
        if self.model_type != "qwen2" or self.qk_norm or not self.qkv_bias:
            raise ValueError("Qwen2.5-VL's decoder is a Qwen2 decoder (model_type 'qwen2').")
        if self.rope_scaling:
            raise ValueError("Scaled RoPE with M-RoPE is not supported.")
        if self.vision.out_dim != self.embed_dim:
            raise ValueError(f"vision.out_dim {self.vision.out_dim} must equal the decoder's "
                             f"embed_dim {self.embed_dim}.")

    def num_params(self) -> int:
        return super().num_params() + self.vision.num_params()


# A random-init preset for tests and CPU runs (`model.checkpoint: tiny_vl`): the "tiny" decoder
# with a 2-block tower on the released patch geometry (14 px patches, 2 x 2 merge, 112 px
# windows). Its vision token ids are the run tokenizer's (`skilljax.experiment.build_model`).
PRESETS: dict[str, QwenVLConfig] = {
    "tiny_vl": QwenVLConfig(
        vocab_size=512, embed_dim=128, mlp_dim=320, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=32, rope_theta=1e4, max_position_embeddings=8192, model_type="qwen2",
        qkv_bias=True, qk_norm=False, mrope_section=(4, 6, 6), image_token_id=3,
        video_token_id=4, vision_start_token_id=5, vision_end_token_id=6,
        vision=VisionConfig(depth=2, embed_dim=64, mlp_dim=128, num_heads=2, out_dim=128,
                            fullatt_block_indexes=(1,))),
}


# ----------------------------------------------------------------------------- HF config.json


def from_hf_config(hf: Mapping[str, Any], **overrides) -> QwenVLConfig:
    """QwenVLConfig from a Qwen2.5-VL `config.json`: transformers 5 nests the decoder in
    `text_config`; 4.x checkpoints keep it at the top level with `rope_scaling` type "mrope"."""
    if hf.get("model_type") != "qwen2_5_vl":
        raise ValueError(f"Unsupported model_type {hf.get('model_type')!r}: skilljax.models.qwen_vl "
                         "handles 'qwen2_5_vl' (Qwen2-VL's vision tower differs and is not ported).")
    text = dict(hf.get("text_config") or {k: v for k, v in hf.items() if k != "vision_config"})
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    section = rope.pop("mrope_section", None) or (16, 24, 24)
    kind = rope.pop("rope_type", rope.pop("type", "default"))
    rope["rope_type"] = "default" if kind == "mrope" else kind
    rope.setdefault("rope_theta", text.get("rope_theta", hf.get("rope_theta", 1e6)))
    text.update(model_type="qwen2", rope_parameters=rope, rope_scaling=None,
                tie_word_embeddings=hf.get("tie_word_embeddings",
                                           text.get("tie_word_embeddings", False)),
                dtype=hf.get("dtype") or hf.get("torch_dtype") or text.get("dtype"))
    text.setdefault("rms_norm_eps", 1e-5)  # the Qwen2.5-VL text config's default
    kw = dataclasses.asdict(qwen.from_hf_config(text))

    v = dict(hf.get("vision_config") or {})
    if v.get("hidden_act", "silu") != "silu":
        raise ValueError(f"vision hidden_act={v['hidden_act']!r} is not supported (Qwen2.5-VL: silu).")
    vision = VisionConfig(
        depth=v.get("depth", 32), embed_dim=v.get("hidden_size", 3584),
        mlp_dim=v.get("intermediate_size", 3420), num_heads=v.get("num_heads", 16),
        out_dim=v.get("out_hidden_size", 3584), in_channels=v.get("in_channels", 3),
        patch_size=v.get("patch_size", 14), temporal_patch_size=v.get("temporal_patch_size", 2),
        spatial_merge_size=v.get("spatial_merge_size", 2), window_size=v.get("window_size", 112),
        fullatt_block_indexes=tuple(v.get("fullatt_block_indexes", (7, 15, 23, 31))),
        tokens_per_second=v.get("tokens_per_second", 4),
        rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        initializer_range=v.get("initializer_range", 0.02))
    ids = {k: hf[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                              "vision_end_token_id") if k in hf}
    kw.update(mrope_section=tuple(section), vision=vision, **ids)
    kw.update(overrides)
    return QwenVLConfig(**kw)


def to_hf_config(cfg: QwenVLConfig, dtype: str | None = None) -> dict[str, Any]:
    """The transformers 5 `config.json` of Qwen2_5_VLForConditionalGeneration."""
    text = qwen.to_hf_config(cfg, dtype)
    for key in ("architectures", "rope_theta", "rope_scaling", "tie_word_embeddings", "dtype"):
        text.pop(key)
    text.update(model_type="qwen2_5_vl_text", rope_parameters={
        "rope_type": "default", "rope_theta": cfg.rope_theta,
        "mrope_section": list(cfg.mrope_section)})
    v = cfg.vision
    vision = {
        "model_type": "qwen2_5_vl_vision", "depth": v.depth, "hidden_size": v.embed_dim,
        "intermediate_size": v.mlp_dim, "num_heads": v.num_heads, "out_hidden_size": v.out_dim,
        "in_channels": v.in_channels, "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size,
        "spatial_merge_size": v.spatial_merge_size, "window_size": v.window_size,
        "fullatt_block_indexes": list(v.fullatt_block_indexes), "hidden_act": "silu",
        "tokens_per_second": v.tokens_per_second, "initializer_range": v.initializer_range,
        "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
    }
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "text_config": text, "vision_config": vision, "image_token_id": cfg.image_token_id,
        "video_token_id": cfg.video_token_id, "vision_start_token_id": cfg.vision_start_token_id,
        "vision_end_token_id": cfg.vision_end_token_id,
        "tie_word_embeddings": cfg.tie_embeddings, "dtype": dtype or cfg.param_dtype,
    }


# ----------------------------------------------------------------------------- host-side inputs


class VisionInputs(NamedTuple):
    """The images of one forward pass, ready for the tower (`vision_inputs` builds it).

    Per-patch arrays are in window order: the merge units (m² consecutive patches each) sorted by
    (frame, window row, window col), raster order within a window."""
    patches_PK: jax.Array   # pixel values in the processor's order
    order_U: jax.Array      # window order: processor-order index of each merge unit
    inverse_U: jax.Array    # argsort(order_U): back to the processor's order
    rows_P: jax.Array       # patch row within its image (2-D RoPE)
    cols_P: jax.Array       # patch column within its image
    frame_P: jax.Array      # segment of full-attention blocks (one per image frame)
    window_P: jax.Array     # segment of windowed blocks


def vision_inputs(pixel_values: np.ndarray, grid_thw: np.ndarray, vcfg: VisionConfig
                  ) -> VisionInputs:
    """Index arrays of the window order, the 2-D positions and the attention segments."""
    m, win = vcfg.spatial_merge_size, vcfg.merger_window
    sub_rows, sub_cols = np.divmod(np.arange(m * m), m)  # a merge unit's patches, row-major
    order, rows, cols, frames, windows = [], [], [], [], []
    units = frame_base = window_base = 0
    for t, h, w in np.asarray(grid_thw, np.int64).reshape(-1, 3):
        bh, bw = h // m, w // m
        nwh, nww = -(-bh // win), -(-bw // win)
        tt, yy, xx = (a.ravel() for a in np.meshgrid(np.arange(t), np.arange(bh), np.arange(bw),
                                                     indexing="ij"))
        window = (tt * nwh + yy // win) * nww + xx // win
        perm = np.argsort(window, kind="stable")
        order.append(units + perm)
        rows.append((yy[perm, None] * m + sub_rows).ravel())
        cols.append((xx[perm, None] * m + sub_cols).ravel())
        frames.append(np.repeat(frame_base + tt[perm], m * m))
        windows.append(np.repeat(window_base + window[perm], m * m))
        units, frame_base, window_base = units + t * bh * bw, frame_base + t, window_base + t * nwh * nww
    pixel_values = np.asarray(pixel_values, np.float32)
    if pixel_values.shape != (units * m * m, vcfg.patch_dim):
        raise ValueError(f"pixel_values of shape {pixel_values.shape}; grid_thw implies "
                         f"{(units * m * m, vcfg.patch_dim)}.")
    order = np.concatenate(order).astype(np.int32)
    cat = lambda xs: np.concatenate(xs).astype(np.int32)
    return VisionInputs(pixel_values, order, np.argsort(order).astype(np.int32), cat(rows),
                        cat(cols), cat(frames), cat(windows))


def pad_vision_inputs(vision: VisionInputs, units: int, vcfg: VisionConfig) -> VisionInputs:
    """`vision` with zero patches appended up to `units` merge units, so that the tower compiles
    once per bucket of sizes rather than once per size. The padding is a frame and a window of its
    own (no real patch attends to it, nor it to them) and comes after every image in both orders:
    the features of the real images keep their indices, and no image-pad token reads the rest."""
    m2 = vcfg.spatial_merge_size ** 2
    real = vision.order_U.shape[0]
    if units < real:
        raise ValueError(f"Cannot pad {real} merge units down to {units}.")
    if units == real:
        return vision
    extra = units - real
    tail_U = np.arange(real, units, dtype=np.int32)
    fill = lambda a, value: np.concatenate([np.asarray(a), np.full(extra * m2, value, np.int32)])
    next_id = lambda a: int(np.max(a)) + 1 if len(a) else 0
    return VisionInputs(
        np.concatenate([np.asarray(vision.patches_PK),
                        np.zeros((extra * m2, vcfg.patch_dim), np.float32)]),
        np.concatenate([np.asarray(vision.order_U), tail_U]),
        np.concatenate([np.asarray(vision.inverse_U), tail_U]),
        fill(vision.rows_P, 0), fill(vision.cols_P, 0),
        fill(vision.frame_P, next_id(vision.frame_P)), fill(vision.window_P, next_id(vision.window_P)))


def row_vision_inputs(images: Sequence, vcfg: VisionConfig, units: int | None = None
                      ) -> VisionInputs:
    """Per-row vision inputs for a batch of sequences (the learner's): `images[b]` is row b's
    (pixel_values, grid_thw) or None. Each row's images are padded (`pad_vision_inputs`) to
    `units` merge units (default: the most any row has), so the arrays stack to [B, ...] and can
    be split and sharded by rows like the tokens; the tower attends within each row only."""
    m2 = vcfg.spatial_merge_size ** 2
    rows = [None if x is None else vision_inputs(x[0], x[1], vcfg) for x in images]
    most = max([0] + [len(r.order_U) for r in rows if r is not None])
    units = most if units is None else units
    if units < most or units < 1:
        raise ValueError(f"units={units}: a row has {most} merge units (and the rows need >= 1).")
    empty = VisionInputs(np.zeros((0, vcfg.patch_dim), np.float32),
                         *(np.zeros(n, np.int32) for n in (0, 0, 0, 0, 0, 0)))
    padded = [pad_vision_inputs(empty if r is None else r, units, vcfg) for r in rows]
    out = VisionInputs(*(np.stack(xs) for xs in zip(*padded)))
    assert out.patches_PK.shape[1] == units * m2
    return out


def rope_index(tokens_BT: np.ndarray, mask_BT: np.ndarray | None, grid_thw: np.ndarray | None,
               cfg: QwenVLConfig) -> tuple[np.ndarray, np.ndarray]:
    """M-RoPE positions [3, B, T] and each row's delta [B] (arXiv 2409.12191 §2.1).

    Text tokens count up on all three rows. An image's t·h·w / m² pad tokens sit at (start + frame,
    start + row, start + col) on the merged grid, and the text after it resumes at start + max(h, w)
    / m. Images are taken from `grid_thw` in order of appearance (row by row). Padding (mask 0) gets
    position 0. Decoding continues at (number of real tokens so far) + delta on every row."""
    tokens_BT = np.asarray(tokens_BT)
    mask_BT = np.ones_like(tokens_BT, bool) if mask_BT is None else np.asarray(mask_BT, bool)
    grids = iter(np.zeros((0, 3), np.int64) if grid_thw is None
                 else np.asarray(grid_thw).reshape(-1, 3))
    m = cfg.vision.spatial_merge_size
    positions = np.zeros((3, *tokens_BT.shape), np.int64)
    deltas = np.zeros(tokens_BT.shape[0], np.int64)
    for b in range(tokens_BT.shape[0]):
        ids = tokens_BT[b][mask_BT[b]]
        pos = np.zeros((3, len(ids)), np.int64)
        is_image = ids == cfg.image_token_id
        i = current = 0
        while i < len(ids):
            if not is_image[i]:  # a text run, up to the next image-pad token
                j = i + int(np.argmax(is_image[i:])) if is_image[i:].any() else len(ids)
                pos[:, i:j] = current + np.arange(j - i)
                i, current = j, current + j - i
                continue
            try:
                t, h, w = (int(x) for x in next(grids))
            except StopIteration:
                raise ValueError("More image-pad runs in the tokens than images in grid_thw.") from None
            h, w = h // m, w // m
            n = t * h * w
            if i + n > len(ids) or not is_image[i:i + n].all():
                raise ValueError(f"Row {b}: an image of grid {t} x {h} x {w} (merged) needs {n} "
                                 "consecutive image-pad tokens.")
            pos[:, i:i + n] = current + np.stack(np.meshgrid(
                np.arange(t), np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1)
            i, current = i + n, current + max(h, w)
        positions[:, b, mask_BT[b]] = pos
        deltas[b] = (pos.max() + 1 if len(ids) else 0) - len(ids)
    if next(grids, None) is not None:
        raise ValueError("grid_thw has more images than the tokens have image-pad runs.")
    return positions.astype(np.int32), deltas.astype(np.int32)


# ----------------------------------------------------------------------------- vision tower


class VisionAttention(nnx.Module):
    def __init__(self, vcfg: VisionConfig, dtypes: tuple, *, rngs: nnx.Rngs):
        pd, self.dtype = dtypes
        d, n, h, std = vcfg.embed_dim, vcfg.num_heads, vcfg.head_dim, vcfg.initializer_range
        self.qkv = _param(rngs, (d, 3, n, h), ("embed", None, "heads", "head_dim"), std, pd)
        self.qkv_bias = nnx.Param(jnp.zeros((3, n, h), pd), logical_axes=(None, "heads", "head_dim"))
        self.proj = _param(rngs, (n, h, d), ("heads", "head_dim", "embed"), std, pd)
        self.proj_bias = nnx.Param(jnp.zeros((d,), pd), logical_axes=("norm",))

    def __call__(self, x_RPD, rope: qwen.Rope, mask_RPP):
        """Rows (R) attend within themselves: one row per learner sample, or one row holding
        every image of a sampler chunk."""
        dt = self.dtype
        d, _, n, h = self.qkv.shape
        r, p = x_RPD.shape[:2]
        qkv_RPF = jnp.einsum("RPD,DF->RPF", x_RPD, self.qkv[...].astype(dt).reshape(d, -1))
        qkv_RP3NH = qkv_RPF.reshape(r, p, 3, n, h) + self.qkv_bias[...].astype(dt)
        q_RPNH, k_RPNH, v_RPNH = (qkv_RP3NH[:, :, i] for i in range(3))
        q_RPNH, k_RPNH = (qwen.apply_rope(x, rope) for x in (q_RPNH, k_RPNH))
        logits_RNPQ = jnp.einsum("RPNH,RQNH->RNPQ", q_RPNH, k_RPNH,
                                 preferred_element_type=jnp.float32) * h ** -0.5
        logits_RNPQ = jnp.where(mask_RPP[:, None], logits_RNPQ, jnp.finfo(jnp.float32).min)
        probs_RNPQ = jax.nn.softmax(logits_RNPQ, axis=-1).astype(dt)
        out_RPF = jnp.einsum("RNPQ,RQNH->RPNH", probs_RNPQ, v_RPNH).reshape(r, p, n * h)
        return out_RPF @ self.proj[...].astype(dt).reshape(n * h, d) + self.proj_bias[...].astype(dt)


class VisionMLP(nnx.Module):
    """SwiGLU with biases."""

    def __init__(self, vcfg: VisionConfig, dtypes: tuple, *, rngs: nnx.Rngs):
        pd, self.dtype = dtypes
        d, f, std = vcfg.embed_dim, vcfg.mlp_dim, vcfg.initializer_range
        self.gate = _param(rngs, (d, f), ("embed", "mlp"), std, pd)
        self.gate_bias = nnx.Param(jnp.zeros((f,), pd), logical_axes=("mlp",))
        self.up = _param(rngs, (d, f), ("embed", "mlp"), std, pd)
        self.up_bias = nnx.Param(jnp.zeros((f,), pd), logical_axes=("mlp",))
        self.down = _param(rngs, (f, d), ("mlp", "embed"), std, pd)
        self.down_bias = nnx.Param(jnp.zeros((d,), pd), logical_axes=("norm",))

    def __call__(self, x_PD):
        linear = lambda name, x: (x @ getattr(self, name)[...].astype(self.dtype)
                                  + getattr(self, name + "_bias")[...].astype(self.dtype))
        return linear("down", jax.nn.silu(linear("gate", x_PD)) * linear("up", x_PD))


class VisionBlock(nnx.Module):
    def __init__(self, vcfg: VisionConfig, dtypes: tuple, *, rngs: nnx.Rngs):
        pd = dtypes[0]
        self.norm1 = qwen.RMSNorm(vcfg.embed_dim, VISION_RMS_EPS, param_dtype=pd)
        self.attn = VisionAttention(vcfg, dtypes, rngs=rngs)
        self.norm2 = qwen.RMSNorm(vcfg.embed_dim, VISION_RMS_EPS, param_dtype=pd)
        self.mlp = VisionMLP(vcfg, dtypes, rngs=rngs)

    def __call__(self, x_RPD, rope, mask_RPP):
        x_RPD = x_RPD + self.attn(self.norm1(x_RPD), rope, mask_RPP)
        return x_RPD + self.mlp(self.norm2(x_RPD))


class PatchMerger(nnx.Module):
    """RMSNorm per patch, then an MLP over each merge unit's m² patches concatenated."""

    def __init__(self, vcfg: VisionConfig, dtypes: tuple, *, rngs: nnx.Rngs):
        pd, self.dtype = dtypes
        u, std = vcfg.embed_dim * vcfg.spatial_merge_size ** 2, vcfg.initializer_range
        self.norm = qwen.RMSNorm(vcfg.embed_dim, VISION_RMS_EPS, param_dtype=pd)
        self.fc1 = _param(rngs, (u, u), (None, "mlp"), std, pd)
        self.fc1_bias = nnx.Param(jnp.zeros((u,), pd), logical_axes=("mlp",))
        self.fc2 = _param(rngs, (u, vcfg.out_dim), ("mlp", "embed"), std, pd)
        self.fc2_bias = nnx.Param(jnp.zeros((vcfg.out_dim,), pd), logical_axes=("norm",))

    def __call__(self, x_RPD):
        dt = self.dtype
        x_RUF = self.norm(x_RPD).reshape(x_RPD.shape[0], -1, self.fc1.shape[0])
        h_RUF = jax.nn.gelu(x_RUF @ self.fc1[...].astype(dt) + self.fc1_bias[...].astype(dt),
                            approximate=False)
        return h_RUF @ self.fc2[...].astype(dt) + self.fc2_bias[...].astype(dt)


def vision_rope(vcfg: VisionConfig, rows_RP, cols_RP) -> qwen.Rope:
    """2-D RoPE: the first half of the rotated pairs turn with the patch row, the second half with
    its column, each over head_dim / 4 frequencies."""
    quarter = vcfg.head_dim // 4
    inv_freq = 1.0 / vcfg.rope_theta ** (np.arange(0, 2 * quarter, 2, dtype=np.float32) / (2 * quarter))
    freqs = [p.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq) for p in (rows_RP, cols_RP)]
    angles_RPH = jnp.concatenate(freqs * 2, axis=-1)
    return qwen.Rope(jnp.cos(angles_RPH)[:, :, None], jnp.sin(angles_RPH)[:, :, None])


class VisionTower(nnx.Module):
    def __init__(self, cfg: QwenVLConfig, layout: shd.Layout | None, *, rngs: nnx.Rngs):
        v, pd = cfg.vision, DTYPES[cfg.param_dtype]
        dtypes = (pd, DTYPES[cfg.dtype])
        self.vcfg, self.dtype, self.remat, self.layout = v, DTYPES[cfg.dtype], cfg.remat, layout
        shape = (v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size, v.embed_dim)
        self.patch_embed = _param(rngs, shape, (None, None, None, None, "embed"),
                                  v.initializer_range, pd)
        self.blocks = qwen._stacked([VisionBlock(v, dtypes, rngs=rngs) for _ in range(v.depth)])
        self.merger = PatchMerger(v, dtypes, rngs=rngs)

    def __call__(self, vision: VisionInputs) -> jax.Array:
        """Merged features, one per image-pad token, images in order: [U, out_dim] for flat
        inputs (`vision_inputs`), [R, U, out_dim] for per-row inputs (`row_vision_inputs`, whose
        rows attend only within themselves)."""
        flat = vision.patches_PK.ndim == 2
        if flat:
            vision = VisionInputs(*(x[None] for x in vision))
        v, dt = self.vcfg, self.dtype
        r, units = vision.order_U.shape
        # The 3-D patch embedding: a Conv3d whose kernel is the whole patch, i.e. one matmul.
        x_RPD = vision.patches_PK.astype(dt) @ self.patch_embed[...].astype(dt).reshape(-1, v.embed_dim)
        x_RUMD = jnp.take_along_axis(x_RPD.reshape(r, units, -1, v.embed_dim),
                                     vision.order_U[:, :, None, None], axis=1)
        x_RPD = shd.constrain(x_RUMD.reshape(r, -1, v.embed_dim), ("batch", "seq", "act_embed"),
                              self.layout)
        rope = vision_rope(v, vision.rows_P, vision.cols_P)
        full_RPP = vision.frame_P[:, :, None] == vision.frame_P[:, None, :]
        window_RPP = vision.window_P[:, :, None] == vision.window_P[:, None, :]
        is_full_L = jnp.asarray([i in v.fullatt_block_indexes for i in range(v.depth)])
        graphdef, blocks = nnx.split(self.blocks)

        def body(x_RPD, xs):
            block, is_full = xs
            mask_RPP = jnp.where(is_full, full_RPP, window_RPP)
            return nnx.merge(graphdef, block)(x_RPD, rope, mask_RPP), None

        if self.remat != "none":
            body = jax.checkpoint(body, policy=REMAT_POLICIES[self.remat], prevent_cse=False)
        x_RPD, _ = jax.lax.scan(body, x_RPD, (blocks, is_full_L))
        out_RUD = jnp.take_along_axis(self.merger(x_RPD), vision.inverse_U[:, :, None], axis=1)
        return out_RUD[0] if flat else out_RUD


# ----------------------------------------------------------------------------- the model


def place_images(x_BTD, is_image_BT, features):
    """Image features written over the image-pad embeddings, in order: `features` [U, D] are
    read row after row (a sampler chunk's images), [B, U, D] row by row (one row's own images)."""
    if features.ndim == 2:
        index_BT = jnp.cumsum(is_image_BT.reshape(-1)).reshape(is_image_BT.shape) - 1
        index_BT = jnp.clip(index_BT, 0, features.shape[0] - 1)
        picked_BTD = features[index_BT]
    else:
        index_BT = jnp.clip(jnp.cumsum(is_image_BT, axis=1) - 1, 0, features.shape[1] - 1)
        picked_BTD = jnp.take_along_axis(features, index_BT[..., None], axis=1)
    return jnp.where(is_image_BT[..., None], picked_BTD.astype(x_BTD.dtype), x_BTD)


class QwenVL(qwen.Qwen):
    """Qwen2.5-VL: `__call__` is qwen.Qwen's with `vision` (the images of a prefill) added; decode
    steps pass none. Positions are [3, B, T] (`rope_index`) or, for text-only steps, [B, T]."""

    def __init__(self, cfg: QwenVLConfig, layout: shd.Layout | None = None, *, rngs: nnx.Rngs):
        super().__init__(cfg, layout, rngs=rngs)
        self.visual = VisionTower(cfg, layout, rngs=rngs)

    def hidden(self, tokens_BT, positions_BT, mask_BTS, cache: qwen.LayerCache | None = None,
               cache_index=None, vision: VisionInputs | None = None):
        x_BTD = self.embed(tokens_BT)
        if vision is not None:
            x_BTD = place_images(x_BTD, tokens_BT == self.cfg.image_token_id, self.visual(vision))
        return self.hidden_from_embeds(x_BTD, positions_BT, mask_BTS, cache, cache_index)

    def __call__(self, tokens_BT, positions_BT, mask_BTS, cache=None, cache_index=None,
                 vision: VisionInputs | None = None):
        h_BTD, cache = self.hidden(tokens_BT, positions_BT, mask_BTS, cache, cache_index, vision)
        return self.logits(h_BTD), cache


def prepare(cfg: QwenVLConfig, tokens_BT, mask_BT=None, pixel_values=None, grid_thw=None
            ) -> tuple[np.ndarray, np.ndarray, VisionInputs | None]:
    """Host side of a prefill: (positions [3, B, T], rope deltas [B], vision inputs or None)."""
    tokens_BT = np.asarray(tokens_BT)
    if mask_BT is not None:
        tokens_BT = np.where(np.asarray(mask_BT, bool), tokens_BT, -1)  # padding is never an image
    pads = int((tokens_BT == cfg.image_token_id).sum())
    wanted = 0 if grid_thw is None else sum(
        vl_image.num_image_tokens(grid_thw, cfg.vision.spatial_merge_size))
    if pads != wanted:
        raise ValueError(f"{pads} image-pad tokens in the prompt, {wanted} image features.")
    positions, deltas = rope_index(tokens_BT, mask_BT, grid_thw, cfg)
    vision = None if grid_thw is None else vision_inputs(pixel_values, grid_thw, cfg.vision)
    return positions, deltas, vision


def sequence_logits(model: QwenVL, tokens_BT, mask_BT, positions_3BT,
                    vision: VisionInputs | None = None) -> jax.Array:
    """Float32 logits [B, T, V] of plain (left- or right-padded) sequences with their images."""
    logits_BTV, _ = model(tokens_BT, positions_3BT, qwen.causal_mask(mask_BT), vision=vision)
    return logits_BTV


forward = nnx.jit(sequence_logits)


def abstract_model(cfg: QwenVLConfig, layout: shd.Layout | None = None) -> QwenVL:
    return qwen.abstract_model(cfg, layout, QwenVL)


def abstract_model_of(cfg: QwenConfig, layout: shd.Layout | None = None) -> qwen.Qwen:
    """The abstract model a config describes: a QwenVL for a QwenVLConfig, else a text Qwen."""
    if isinstance(cfg, QwenVLConfig):
        return abstract_model(cfg, layout)
    return qwen.abstract_model(cfg, layout)


def create(cfg: QwenVLConfig, layout: shd.Layout | None = None, seed: int = 0) -> QwenVL:
    """A randomly initialised model whose parameters are born sharded."""
    return qwen.create(cfg, layout, seed, QwenVL)


def images_to_inputs(cfg: QwenVLConfig, images: Sequence, **preprocess_kw
                     ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(pixel_values, grid_thw, image-pad tokens per image) of PIL images, with vl_image."""
    v = cfg.vision
    pixels, grid = vl_image.preprocess(images, patch_size=v.patch_size,
                                       merge_size=v.spatial_merge_size,
                                       temporal_patch_size=v.temporal_patch_size, **preprocess_kw)
    return pixels, grid, vl_image.num_image_tokens(grid, v.spatial_merge_size)


__all__ = ["VisionConfig", "QwenVLConfig", "QwenVL", "VisionInputs", "from_hf_config",
           "to_hf_config", "vision_inputs", "pad_vision_inputs", "row_vision_inputs", "rope_index",
           "prepare", "forward", "create", "abstract_model", "images_to_inputs", "PRESETS"]
