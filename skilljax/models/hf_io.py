"""Hugging Face safetensors ⇄ skilljax parameters through one declarative table.

`TABLE` maps each HF tensor name to a parameter path and says how the layouts differ: HF `Linear`
weights are stored [out, in]; ours are [in, out] with the head dimensions split out (q: D,N,H;
o: N,H,D), and HF vectors are flat. The same rule converts in both directions, so loading and
export cannot drift apart. Qwen2.5-VL checkpoints use the text rows for their decoder and the
`visual.*` rows for the vision tower (`model_type` "qwen2_5_vl" in config.json selects the model).

Loading reads safetensors through a memory map and builds each parameter with
`jax.make_array_from_callback`, so every device reads only its own slice from disk; no parameter
is materialised whole on one device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from skilljax import sharding as shd
from skilljax.models import qwen, qwen_vl


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read as the model its config.json describes."""


@dataclasses.dataclass(frozen=True)
class Rule:
    hf: str           # regex over HF tensor names; groups fill `ours`
    ours: str         # our parameter path, '.'-joined, with {0} for the layer index
    kind: str         # "linear": HF [out, in] ⇄ ours [*in, *out]; "vector": HF flat; "same";
                      # "conv": HF [out, *in] ⇄ ours [*in, out] (a patch-sized Conv kernel)
    in_dims: int = 1  # for "linear": how many of our leading dims make HF's `in`

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.kind == "linear":
            return (math.prod(shape[self.in_dims:]), math.prod(shape[:self.in_dims]))
        if self.kind == "vector":
            return (math.prod(shape),)
        if self.kind == "conv":
            return (shape[-1], *shape[:-1])
        return shape

    def to_ours(self, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A view when numpy can make one; the loader slices it lazily per device."""
        if self.kind == "conv":
            return np.moveaxis(a, 0, -1)
        return (a.T if self.kind == "linear" else a).reshape(shape)

    def to_hf(self, a: np.ndarray) -> np.ndarray:
        hf_shape = self.hf_shape(a.shape)
        if self.kind == "conv":
            return np.ascontiguousarray(np.moveaxis(a, -1, 0))
        if self.kind == "linear":
            a = a.reshape(hf_shape[::-1]).T
        return np.ascontiguousarray(a.reshape(hf_shape))


_L = r"model\.layers\.(\d+)\."
_V = r"visual\.blocks\.(\d+)\."
TABLE: tuple[Rule, ...] = (
    Rule(r"model\.embed_tokens\.weight", "embedding", "same"),
    Rule(_L + r"self_attn\.q_proj\.weight", "layers.{0}.attn.q", "linear"),
    Rule(_L + r"self_attn\.k_proj\.weight", "layers.{0}.attn.k", "linear"),
    Rule(_L + r"self_attn\.v_proj\.weight", "layers.{0}.attn.v", "linear"),
    Rule(_L + r"self_attn\.o_proj\.weight", "layers.{0}.attn.o", "linear", in_dims=2),
    Rule(_L + r"self_attn\.q_proj\.bias", "layers.{0}.attn.q_bias", "vector"),
    Rule(_L + r"self_attn\.k_proj\.bias", "layers.{0}.attn.k_bias", "vector"),
    Rule(_L + r"self_attn\.v_proj\.bias", "layers.{0}.attn.v_bias", "vector"),
    Rule(_L + r"self_attn\.o_proj\.bias", "layers.{0}.attn.o_bias", "vector"),
    Rule(_L + r"self_attn\.q_norm\.weight", "layers.{0}.attn.q_norm.scale", "vector"),
    Rule(_L + r"self_attn\.k_norm\.weight", "layers.{0}.attn.k_norm.scale", "vector"),
    Rule(_L + r"mlp\.gate_proj\.weight", "layers.{0}.mlp.gate", "linear"),
    Rule(_L + r"mlp\.up_proj\.weight", "layers.{0}.mlp.up", "linear"),
    Rule(_L + r"mlp\.down_proj\.weight", "layers.{0}.mlp.down", "linear"),
    Rule(_L + r"input_layernorm\.weight", "layers.{0}.attn_norm.scale", "vector"),
    Rule(_L + r"post_attention_layernorm\.weight", "layers.{0}.mlp_norm.scale", "vector"),
    Rule(r"model\.norm\.weight", "final_norm.scale", "vector"),
    Rule(r"lm_head\.weight", "lm_head", "linear"),
    # Qwen2.5-VL's vision tower (qwen_vl.VisionTower); its decoder uses the rows above.
    Rule(r"visual\.patch_embed\.proj\.weight", "visual.patch_embed", "conv"),
    Rule(_V + r"attn\.qkv\.weight", "visual.blocks.{0}.attn.qkv", "linear"),
    Rule(_V + r"attn\.qkv\.bias", "visual.blocks.{0}.attn.qkv_bias", "vector"),
    Rule(_V + r"attn\.proj\.weight", "visual.blocks.{0}.attn.proj", "linear", in_dims=2),
    Rule(_V + r"attn\.proj\.bias", "visual.blocks.{0}.attn.proj_bias", "vector"),
    Rule(_V + r"mlp\.gate_proj\.weight", "visual.blocks.{0}.mlp.gate", "linear"),
    Rule(_V + r"mlp\.gate_proj\.bias", "visual.blocks.{0}.mlp.gate_bias", "vector"),
    Rule(_V + r"mlp\.up_proj\.weight", "visual.blocks.{0}.mlp.up", "linear"),
    Rule(_V + r"mlp\.up_proj\.bias", "visual.blocks.{0}.mlp.up_bias", "vector"),
    Rule(_V + r"mlp\.down_proj\.weight", "visual.blocks.{0}.mlp.down", "linear"),
    Rule(_V + r"mlp\.down_proj\.bias", "visual.blocks.{0}.mlp.down_bias", "vector"),
    Rule(_V + r"norm1\.weight", "visual.blocks.{0}.norm1.scale", "vector"),
    Rule(_V + r"norm2\.weight", "visual.blocks.{0}.norm2.scale", "vector"),
    Rule(r"visual\.merger\.ln_q\.weight", "visual.merger.norm.scale", "vector"),
    Rule(r"visual\.merger\.mlp\.0\.weight", "visual.merger.fc1", "linear"),
    Rule(r"visual\.merger\.mlp\.0\.bias", "visual.merger.fc1_bias", "vector"),
    Rule(r"visual\.merger\.mlp\.2\.weight", "visual.merger.fc2", "linear"),
    Rule(r"visual\.merger\.mlp\.2\.bias", "visual.merger.fc2_bias", "vector"),
)
# Buffers some exporters write that carry no parameters.
IGNORED = (re.compile(r".*rotary_emb\.inv_freq"),)
# transformers 5 names Qwen2.5-VL's modules model.language_model.* and model.visual.* in memory (and
# some checkpoints were saved so); save_pretrained writes the original names the table uses.
ALIASES = ((re.compile(r"^model\.language_model\."), "model."),
           (re.compile(r"^model\.visual\."), "visual."))
# Our stacked modules: parameters with a leading layer axis, named per layer in the table.
STACKED = ("layers.", "visual.blocks.")


def hf_to_ours(name: str) -> tuple[Rule, str] | None:
    for pattern, replacement in ALIASES:
        name = pattern.sub(replacement, name)
    for rule in TABLE:
        m = re.fullmatch(rule.hf, name)
        if m:
            return rule, rule.ours.format(*m.groups())
    return None


def ours_to_hf(path: str) -> tuple[Rule, str]:
    for rule in TABLE:
        pattern = re.escape(rule.ours).replace(re.escape("{0}"), r"(\d+)")
        m = re.fullmatch(pattern, path)
        if m:
            hf = rule.hf.replace(r"(\d+)", "{}").replace("\\", "").format(*m.groups())
            return rule, hf
    raise KeyError(f"Parameter {path!r} has no row in skilljax.models.hf_io.TABLE; add one.")


# ----------------------------------------------------------------------------- safetensors

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Tensors of one .safetensors file as read-only memory-mapped arrays (nothing read yet)."""
    path = Path(path)
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path} is not a valid safetensors file ({e}).") from e
    base = 8 + header_len
    if path.stat().st_size == base:
        return {}
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}.")
        start, end = info["data_offsets"]
        raw = buf[base + start: base + end]
        out[name] = raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    for name, a in arrays.items():
        header[name] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format wants the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for a in arrays.values():
            f.write(a.tobytes())


def checkpoint_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of an HF directory (single file or sharded index), memory-mapped."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (path / f).exists()]
        if missing:
            raise CheckpointError(
                f"{index} lists shard file(s) {missing} that are missing from {path}; the download "
                "or copy is incomplete. Fetch the missing shards.")
        tensors = {}
        for f in files:
            tensors.update(read_safetensors(path / f))
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise CheckpointError(f"{index} maps tensors {absent[:5]} to shards that do not hold them.")
        return tensors
    files = sorted(path.glob("*.safetensors"))
    if not files:
        extra = " (PyTorch .bin checkpoints are not read: re-save with transformers' " \
                "save_pretrained(..., safe_serialization=True))" if list(path.glob("*.bin")) else ""
        raise CheckpointError(f"No model.safetensors or model.safetensors.index.json in {path}{extra}.")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    return tensors


# ----------------------------------------------------------------------------- load / export


def read_config(path: str | os.PathLike, **overrides) -> qwen.QwenConfig:
    """The QwenConfig of an HF directory (a qwen_vl.QwenVLConfig for Qwen2.5-VL)."""
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        raise CheckpointError(f"{path} has no config.json; expected a directory written by "
                              "transformers' save_pretrained or skilljax.tools.export_hf.")
    hf = json.loads(config_file.read_text())
    if hf.get("model_type") == "qwen2_5_vl":
        return qwen_vl.from_hf_config(hf, **overrides)
    return qwen.from_hf_config(hf, **overrides)



def _flat(state) -> Iterator[tuple[str, nnx.Variable]]:
    for keys, var in state.flat_state():
        yield ".".join(str(k) for k in keys), var


def _per_layer(path: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], int | None]]:
    """Our stacked parameter `layers.X` as the per-layer names `layers.{i}.X` the table uses:
    (name, per-layer shape, layer index); other parameters as themselves (index None)."""
    for prefix in STACKED:
        if path.startswith(prefix):
            rest = path[len(prefix):]
            return [(f"{prefix}{i}.{rest}", shape[1:], i) for i in range(shape[0])]
    return [(path, shape, None)]


def load(path: str | os.PathLike, layout: shd.Layout | None = None, *, seed: int = 0,
         **overrides) -> tuple[qwen.QwenConfig, qwen.Qwen]:
    """(config, model) from an HF directory; each tensor goes straight to its target sharding.

    `overrides` replace QwenConfig fields (e.g. dtype="bfloat16", remat="full"). With LoRA
    (`lora_rank` > 0) the adapters are initialised from `seed` (B = 0: the model equals the
    checkpoint's).
    """
    cfg = read_config(path, **overrides)
    tensors = checkpoint_tensors(path)
    graphdef, state = nnx.split(qwen_vl.abstract_model_of(cfg, layout))
    variables = {p: v for p, v in _flat(state) if not isinstance(v, qwen.LoRAParam)}
    targets = {name: (shape, p, i) for p, v in variables.items()
               for name, shape, i in _per_layer(p, tuple(v.shape))}

    found, unexpected, bad_shape = {}, [], []
    for name, array in tensors.items():
        match = hf_to_ours(name)
        if match is None:
            if not any(p.fullmatch(name) for p in IGNORED):
                unexpected.append(name)
            continue
        rule, ours = match
        if ours not in targets:
            if not (ours == "lm_head" and cfg.tie_embeddings):  # tied copies are redundant
                unexpected.append(name)
            continue
        want = rule.hf_shape(targets[ours][0])
        if tuple(array.shape) != want:
            bad_shape.append(f"{name}: checkpoint {tuple(array.shape)}, config implies {want}")
            continue
        found[ours] = (rule, array)
    missing = sorted(set(targets) - set(found))
    problems = []
    if bad_shape:
        problems.append("tensor shapes do not match config.json:\n  " + "\n  ".join(bad_shape))
    if missing:
        problems.append(f"parameters with no tensor in the checkpoint: {missing[:8]}"
                        + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))
    if unexpected:
        problems.append(f"tensors the config does not account for: {sorted(unexpected)[:8]}"
                        + (f" (+{len(unexpected) - 8} more)" if len(unexpected) > 8 else ""))
    if problems:
        raise CheckpointError(
            f"Checkpoint {path} does not match its config.json ({cfg.model_type}, "
            f"{cfg.num_layers} layers, hidden {cfg.embed_dim}, heads {cfg.num_heads}/"
            f"{cfg.num_kv_heads}, head_dim {cfg.head_dim}, tied={cfg.tie_embeddings}):\n"
            + "\n".join(problems))

    views: dict[str, list] = {}
    for name, (shape, ours, i) in targets.items():
        rule, array = found[name]
        views.setdefault(ours, []).append(rule.to_ours(array, shape))
    for ours, var in variables.items():
        shape, dtype = tuple(var.shape), var.dtype
        parts = views[ours]

        def read(idx, parts=parts, stacked=ours.startswith(STACKED)):
            if not stacked:
                return np.asarray(parts[0][idx], dtype=dtype)
            layers = range(len(parts))[idx[0]]
            return np.stack([np.asarray(parts[i][idx[1:]], dtype=dtype) for i in layers])

        whole = tuple(slice(None) for _ in shape)
        if layout is None:
            value = jax.device_put(read(whole))
        else:
            sharding = layout.sharding(shape, shd.logical_axes(var))
            value = jax.make_array_from_callback(shape, sharding, read)
        var.set_value(value)
    if cfg.lora_rank:
        adapters = qwen.create_adapters(cfg, layout, seed)
        for p, v in _flat(state):
            if isinstance(v, qwen.LoRAParam):
                v.set_value(adapters[p])
    return cfg, nnx.merge(graphdef, state)


def export(model: qwen.Qwen, out_dir: str | os.PathLike, *, dtype: str | None = None,
           max_shard_bytes: int = 4 << 30, tokenizer_dir: str | os.PathLike | None = None,
           overwrite: bool = False) -> Path:
    """Write an HF directory `transformers` loads (config.json + safetensors, sharded if large).

    Written to a temporary sibling and renamed into place, so a crash leaves no half-written dir.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass overwrite=True "
                              "(--overwrite) or choose another directory.")
    cfg = model.cfg
    np_dtype = np.dtype(qwen.DTYPES[dtype or cfg.param_dtype])
    tensors = {}
    # LoRA adapters are folded into their weights: the export is a plain model.
    for keys, value in nnx.traversals.flatten_mapping(qwen.merged_state(model)).items():
        value = np.asarray(jax.device_get(value))
        for path, shape, i in _per_layer(".".join(map(str, keys)), value.shape):
            rule, name = ours_to_hf(path)
            tensors[name] = rule.to_hf((value if i is None else value[i]).astype(np_dtype))

    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += nbytes
    shards.append(current)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        to_hf_config = (qwen_vl.to_hf_config if isinstance(cfg, qwen_vl.QwenVLConfig)
                        else qwen.to_hf_config)
        (tmp / "config.json").write_text(json.dumps(
            to_hf_config(cfg.replace(lora_rank=0), dtype or cfg.param_dtype), indent=2))
        if len(shards) == 1:
            write_safetensors(tmp / "model.safetensors", shards[0])
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                write_safetensors(tmp / fname, shard)
                weight_map.update({k: fname for k in shard})
            total = sum(a.nbytes for a in tensors.values())
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        if tokenizer_dir is not None:
            for f in Path(tokenizer_dir).iterdir():
                if f.name.startswith("tokenizer") or f.name in ("vocab.json", "merges.txt"):
                    shutil.copy(f, tmp / f.name)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
