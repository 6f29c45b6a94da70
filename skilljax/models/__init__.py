"""Model construction: `load(path_or_preset, mesh=None, dtype=...)`."""

from __future__ import annotations

import os
from pathlib import Path

from jax.sharding import Mesh

from skilljax import sharding as shd
from skilljax.models import hf_io, qwen, qwen_vl, vl_image
from skilljax.models.qwen import PRESETS, Qwen, QwenConfig


def load(path_or_preset: str | os.PathLike, mesh: Mesh | None = None, dtype: str | None = None, *,
         layout: str = "fsdp_tp", seed: int = 0, **overrides) -> tuple[QwenConfig, Qwen]:
    """(config, model) from an HF directory or a preset name (random init with `seed`).

    A Qwen2.5-VL directory (model_type "qwen2_5_vl") gives (qwen_vl.QwenVLConfig, qwen_vl.QwenVL),
    subclasses of QwenConfig and Qwen.

    With a mesh, parameters are created or loaded directly into the `layout` shardings.
    `dtype` is the compute dtype; parameters stay float32 (master weights) unless `param_dtype` is
    given (inference-only tools pass both). `overrides` replace other QwenConfig fields
    (`remat`, `scan_layers`, `lora_rank`, ...).
    """
    sharding_layout = None if mesh is None else shd.Layout(mesh, layout)
    if dtype is not None:
        overrides.setdefault("dtype", dtype)
    path = Path(path_or_preset)
    if path.is_dir():
        return hf_io.load(path, sharding_layout, seed=seed, **overrides)
    name = str(path_or_preset)
    if name in PRESETS:
        cfg = PRESETS[name].replace(**overrides)
        return cfg, qwen.create(cfg, sharding_layout, seed)
    if name in qwen_vl.PRESETS:
        cfg = qwen_vl.PRESETS[name].replace(**overrides)
        return cfg, qwen_vl.create(cfg, sharding_layout, seed)
    raise ValueError(f"{name!r} is neither a directory nor a preset; presets: "
                     f"{sorted(PRESETS) + sorted(qwen_vl.PRESETS)}.")


def compute_dtype(path_or_preset: str | os.PathLike, dtype: str | None = None) -> str:
    """`dtype`, else the dtype an HF directory is stored in (float32 for presets): inference tools
    keep their parameters in it (no float32 master copy without an optimizer)."""
    if dtype is not None:
        return dtype
    path = Path(path_or_preset)
    return hf_io.read_config(path).dtype if path.is_dir() else "float32"


__all__ = ["load", "compute_dtype", "Qwen", "QwenConfig", "PRESETS", "hf_io", "qwen", "qwen_vl",
           "vl_image"]
