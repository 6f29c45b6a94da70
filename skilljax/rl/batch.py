"""Step samples → the learner's batch: the one place rows are padded, windowed and placed.

`collate` pads every row once: RL batches to `sampling.bucket_length` of the longest sample (2^k
and 1.5·2^k, so a run compiles a handful of lengths); the learner takes its arrays as they are.
(The warm start rounds to a multiple of 32 instead, see `sft.LENGTH_MULTIPLE`.) `response_window` is computed on the host from the loss mask: the
static window over which the learner projects to the vocabulary. `place` puts a (mini-)batch on
the mesh sharded over the batch axes (rows over `data` × `fsdp`), each process supplying only its
own devices' rows (`distributed.put_rows`, i.e. `jax.make_array_from_process_local_data`).

In a multi-process run every process holds the same global host batch (the processes' step
samples are gathered after the rollout, `skilljax.rl.rollout.merge`), so mini-batches are cut from
one global order, exactly as one process would cut them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from skilljax import distributed
from skilljax import sharding as shd
from skilljax.sampling import bucket_length


class Batch(NamedTuple):
    """The learner's arrays (host numpy or device); rows without response tokens are padding."""
    tokens_BT: jax.Array
    loss_mask_BT: jax.Array     # 1 on response tokens
    attn_mask_BT: jax.Array     # 1 on real (prompt or response) tokens
    old_logp_BT: jax.Array
    advantages_B: jax.Array
    ref_logp_BT: jax.Array | None = None
    # Qwen2.5-VL rows: M-RoPE positions per row and each row's own images, padded to one count of
    # merge units: on the host a `RowImages` (drawn when placed), on devices the
    # `qwen_vl.VisionInputs` with rows first; None for a text policy.
    positions_B3T: jax.Array | None = None
    vision: Any = None
    # Truncated importance weights min(π_old / π_behaviour, cap) per token (`Learner.update` sets
    # them when the sampler's policy is not the learner's old one); None: 1.
    is_weight_BT: jax.Array | None = None


class RowImages:
    """Each row's images, loaded only when a (mini-)batch is placed: a batch of thousands of step
    samples holds a few bytes per row on the host (e.g. the history text an image is drawn from),
    not their pixel values. `load(source) -> (pixel_values, grid_thw)`; `units`: merge units every
    row is padded to."""

    def __init__(self, sources: Sequence, load, vcfg, units: int):
        self.sources, self.load, self.vcfg, self.units = list(sources), load, vcfg, units

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, idx) -> "RowImages":
        return RowImages([self.sources[i] for i in np.asarray(idx).reshape(-1)], self.load,
                         self.vcfg, self.units)

    def inputs(self):
        """The rows' `qwen_vl.VisionInputs` (host arrays, rows first)."""
        from skilljax.models import qwen_vl
        return qwen_vl.row_vision_inputs([None if s is None else self.load(s)
                                          for s in self.sources], self.vcfg, self.units)


def _tree(f, x):
    """`f` over the arrays of a field (an array, or the VisionInputs of `vision`); `RowImages`
    stay whole on the host and are drawn when placed."""
    if isinstance(x, RowImages):
        return x
    return jax.tree.map(f, x)


def collate(samples: Sequence, advantages: Sequence[float], pad_id: int,
            length: int | None = None, multiple: int | None = None, *,
            images: Sequence | RowImages | None = None, vl_cfg=None,
            grids: Sequence | None = None) -> Batch:
    """Step samples → right-padded host arrays (prompt then response per row), `length` tokens
    long, else the longest sample rounded up to a `multiple`, else its `bucket_length` (RL).

    `images` (a Qwen2.5-VL policy, with its config `vl_cfg`): each row's images as
    (pixel_values, grid_thw) or None, or a `RowImages` with `grids` (each row's grid_thw or None:
    the positions need only the sizes); the batch then carries M-RoPE positions and the rows'
    images, their merge units padded to a `bucket_length` (few tower shapes per run)."""
    if not samples:
        raise ValueError("collate needs at least one step sample.")
    longest = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    t = length or (-(-longest // multiple) * multiple if multiple else bucket_length(longest))
    b = len(samples)
    tokens = np.full((b, t), pad_id, np.int32)
    loss_mask = np.zeros((b, t), np.float32)
    attn_mask = np.zeros((b, t), np.int32)
    old_logp = np.zeros((b, t), np.float32)
    for r, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.response_ids)
        if p + n > t:
            raise ValueError(f"Sample {r} has {p + n} tokens, more than length={t}.")
        tokens[r, :p + n] = s.prompt_ids + s.response_ids
        attn_mask[r, :p + n] = 1
        loss_mask[r, p:p + n] = 1
        old_logp[r, p:p + n] = s.logprobs
    positions = vision = None
    if images is not None:
        from skilljax.models import qwen_vl, vl_image
        if vl_cfg is None or len(images) != b:
            raise ValueError("collate: images need the model's QwenVLConfig (vl_cfg) and one entry "
                             f"per sample ({b}), got {None if images is None else len(images)}.")
        m = vl_cfg.vision.spatial_merge_size
        if not isinstance(images, RowImages):
            grids = [None if x is None else x[1] for x in images]
            images = RowImages(images, lambda x: x, vl_cfg.vision, 0)
        if grids is None or len(grids) != b:
            raise ValueError("collate: RowImages need each row's grid_thw (grids).")
        positions = np.zeros((b, 3, t), np.int32)
        for r, grid in enumerate(grids):
            positions[r] = qwen_vl.rope_index(tokens[r:r + 1], attn_mask[r:r + 1], grid,
                                              vl_cfg)[0][:, 0]
        units = max([1] + [sum(vl_image.num_image_tokens(g, m)) for g in grids if g is not None])
        vision = RowImages(images.sources, images.load, vl_cfg.vision, bucket_length(units))
    return Batch(tokens, loss_mask, attn_mask, old_logp, np.asarray(advantages, np.float32),
                 positions_B3T=positions, vision=vision)


def to_host(batch: Batch) -> dict[str, np.ndarray]:
    """A batch's fields as host arrays (None fields dropped)."""
    return {k: _tree(distributed.to_host, v) for k, v in batch._asdict().items() if v is not None}


def response_window(loss_mask_BT) -> int | None:
    """A static window length (a `bucket_length` ≥ 16) covering every row's response, for
    `learner.token_logprobs`; None when a row's response is not one contiguous run of the loss
    mask or the window would not be shorter than the sequence (then logits are computed
    everywhere)."""
    m = np.asarray(loss_mask_BT) > 0
    counts = m.sum(axis=1)
    if not counts.any():
        return None
    first = m.argmax(axis=1)
    last = m.shape[1] - 1 - m[:, ::-1].argmax(axis=1)
    rows = counts > 0
    if np.any((last - first + 1)[rows] != counts[rows]):
        return None
    window = bucket_length(int(counts.max()))
    return window if window < m.shape[1] else None


def rows(host: dict[str, np.ndarray], idx: np.ndarray, real: int) -> dict[str, np.ndarray]:
    """Rows `idx` of a host batch; rows past the first `real` carry no loss (padding)."""
    mb = {k: v[idx] if isinstance(v, RowImages) else _tree(lambda a: a[idx], v)
          for k, v in host.items()}
    keep = np.arange(len(idx)) < real
    mb["loss_mask_BT"] = mb["loss_mask_BT"] * keep[:, None].astype(mb["loss_mask_BT"].dtype)
    mb["advantages_B"] = mb["advantages_B"] * keep.astype(mb["advantages_B"].dtype)
    return mb


def place(x: np.ndarray, layout: shd.Layout | None) -> jax.Array:
    """A host array with rows first onto the mesh, rows sharded over the batch axes."""
    if layout is None:
        return jax.device_put(np.asarray(x))  # (jnp.asarray compiles a program per shape)
    return distributed.put_rows(np.asarray(x), layout.sharding(
        x.shape, ("batch",) + (None,) * (x.ndim - 1)))


def place_field(v, layout: shd.Layout | None):
    """One host field onto the mesh (`place` on each array); `RowImages` are drawn here."""
    return jax.tree.map(lambda a: place(a, layout), v.inputs() if isinstance(v, RowImages) else v)


def place_batch(host: dict[str, np.ndarray], layout: shd.Layout | None) -> Batch:
    """Host fields onto the mesh, rows sharded over the batch axes."""
    return Batch(**{k: place_field(v, layout) for k, v in host.items()})
