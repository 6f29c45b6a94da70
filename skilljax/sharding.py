"""Device mesh and THE logical-axis → mesh-axis rules table.

Model code names only logical axes. Parameters use `vocab, embed, heads, kv_heads, head_dim, mlp,
norm, layers, lora`; activations use `batch, seq, act_embed, act_heads, act_kv_heads, act_mlp, act_vocab` (they
differ from the parameter names because FSDP shards a weight's `embed` dimension over `fsdp` while
the activations are sharded over `fsdp` along the batch). A layout is a choice of rules from the
single `RULES` table; FSDP vs tensor parallel is a config edit (`layout=`).

A mesh dimension that does not divide an array dimension is dropped for that array (the dimension
is replicated), so e.g. 2 KV heads on a tensor axis of 4 stay whole; `spec` reports what it dropped
through `dropped_axes` so tests can see it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

_DP = ("data", "fsdp")  # the batch is split over every non-tensor axis

# One row per logical axis; one column per layout. None = replicated.
RULES: dict[str, dict[str, Any]] = {
    #             fsdp      tp        fsdp_tp
    "batch":     {"fsdp": _DP, "tp": _DP, "fsdp_tp": _DP},
    "seq":       {"fsdp": None, "tp": None, "fsdp_tp": None},
    "vocab":     {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "embed":     {"fsdp": "fsdp", "tp": None, "fsdp_tp": "fsdp"},
    "heads":     {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "kv_heads":  {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "head_dim":  {"fsdp": None, "tp": None, "fsdp_tp": None},
    "mlp":       {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "norm":      {"fsdp": None, "tp": None, "fsdp_tp": None},
    "layers":    {"fsdp": None, "tp": None, "fsdp_tp": None},  # stacked layers (scanned)
    "lora":      {"fsdp": None, "tp": None, "fsdp_tp": None},  # LoRA rank
    "act_embed": {"fsdp": None, "tp": None, "fsdp_tp": None},
    "act_heads": {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "act_kv_heads": {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "act_mlp":   {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
    "act_vocab": {"fsdp": None, "tp": "tensor", "fsdp_tp": "tensor"},
}
LAYOUTS = ("fsdp", "tp", "fsdp_tp")


def parse_mesh_spec(text: str) -> dict[str, int]:
    """'data=1,fsdp=2,tensor=2' → {'data': 1, 'fsdp': 2, 'tensor': 2}; -1 means 'the rest'."""
    shape = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in MESH_AXES:
            raise ValueError(
                f"Bad mesh spec {text!r}: expected comma-separated axis=size with axes "
                f"{MESH_AXES}, e.g. 'data=1,fsdp=2,tensor=2'.")
        shape[name] = int(value)
    return shape


def make_mesh(shape: Mapping[str, int] | str | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with axes (data, fsdp, tensor) over the visible devices.

    Missing axes are 1, except that when no axis is -1 and the product is smaller than the number of
    devices this raises (a silently idle device is a bug). One axis may be -1 to take the rest.
    """
    if isinstance(shape, str):
        shape = parse_mesh_spec(shape)
    shape = dict(shape or {"fsdp": -1})
    devices = list(devices if devices is not None else jax.devices())
    sizes = [shape.get(a, 1) for a in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"At most one mesh axis may be -1, got {shape}.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"Mesh {shape}: {len(devices)} devices are not divisible by {known}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"Mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but "
            f"{len(devices)} are visible. On CPU, fake more with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count=N.")
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh plus the rules column of one layout; hashable, so it can sit in a module's graphdef."""
    mesh: Mesh
    name: str = "fsdp_tp"

    def __post_init__(self):
        if self.name not in LAYOUTS:
            raise ValueError(f"Unknown sharding layout {self.name!r}; choose one of {LAYOUTS}.")

    def spec(self, shape: Sequence[int], axes: Sequence[str | None]) -> PartitionSpec:
        return spec(shape, axes, self.mesh, self.name)

    def sharding(self, shape: Sequence[int], axes: Sequence[str | None]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(shape, axes))


def _mesh_axes_for(logical: str | None, layout: str) -> tuple[str, ...]:
    if logical is None:
        return ()
    if logical not in RULES:
        raise KeyError(f"Logical axis {logical!r} has no row in skilljax.sharding.RULES; add one.")
    target = RULES[logical][layout]
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)


def spec(shape: Sequence[int], axes: Sequence[str | None], mesh: Mesh, layout: str) -> PartitionSpec:
    """PartitionSpec for an array of `shape` with logical `axes` under `layout`."""
    if len(shape) != len(axes):
        raise ValueError(f"Array of shape {tuple(shape)} got {len(axes)} logical axes {tuple(axes)}.")
    used: set[str] = set()
    out = []
    for dim, logical in zip(shape, axes):
        mesh_axes = [a for a in _mesh_axes_for(logical, layout)
                     if mesh.shape[a] > 1 and a not in used]
        # Keep the longest prefix of mesh axes whose product divides the dimension.
        keep = []
        for a in mesh_axes:
            if dim % (math.prod(mesh.shape[k] for k in keep) * mesh.shape[a]) == 0:
                keep.append(a)
        used.update(keep)
        out.append(None if not keep else keep[0] if len(keep) == 1 else tuple(keep))
    return PartitionSpec(*out)


def logical_axes(variable: nnx.Variable) -> tuple[str | None, ...]:
    axes = variable.get_metadata().get("logical_axes")
    if axes is None:
        raise ValueError(
            f"Parameter of shape {variable.shape} has no logical_axes metadata, so no sharding "
            "rule applies; create it as nnx.Param(value, logical_axes=(...)).")
    return tuple(axes)


def state_shardings(state: Any, layout: Layout) -> Any:
    """NamedSharding per variable of an (abstract) nnx.State, from its logical_axes metadata."""
    def one(v):
        return v.replace(layout.sharding(v.shape, logical_axes(v)))
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_state(state: Any, layout: Layout | None) -> Any:
    """An abstract nnx.State (ShapeDtypeStruct values) whose values carry their shardings under
    `layout`, from logical_axes metadata (replicated where a variable has none, e.g. an
    optimizer's step count): arguments for ahead-of-time lowering. Unchanged without a layout."""
    if layout is None:
        return state

    def one(v):
        axes = v.get_metadata().get("logical_axes") or (None,) * len(v.shape)
        return v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype,
                                              sharding=layout.sharding(v.shape, axes)))
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def constrain(x: jax.Array, axes: Sequence[str | None], layout: Layout | None) -> jax.Array:
    """with_sharding_constraint by logical axes; a no-op without a layout (single device)."""
    if layout is None:
        return x
    return jax.lax.with_sharding_constraint(x, layout.sharding(x.shape, axes))


def is_split(x: jax.Array) -> bool:
    """True when no device holds the whole array."""
    return all(s.data.shape != x.shape for s in x.addressable_shards)
