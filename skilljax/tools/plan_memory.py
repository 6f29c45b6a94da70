"""Memory plan of a config on a mesh, without weights: what each device holds in the learner's
mini-batch step and in the sampler's prefill and decode, from XLA's compiled memory analysis.

    python -m skilljax.tools.plan_memory --config configs/alfworld_skill0.py:checkpoint=qwen2p5_7b \
        --mesh fsdp=8 [--config.model.lora.rank=16 ...]

`checkpoint` may name a preset (`qwen2p5_3b`, `qwen2p5_7b`, ...) or an HF directory (only its
config.json is read). Every function is lowered from abstract shapes with their shardings and
compiled ahead of time for fake CPU devices (`--xla_force_host_platform_device_count`), so nothing
is allocated and no accelerator is needed. Shapes are the config's:

- train: one AdamW step on one mini-batch (`rl.mini_batch_size` rows, padded as the learner pads
  them) of `prompt.max_prompt_tokens + rl.max_new_tokens` tokens, gradients accumulated over
  `rl.micro_batch_size` rows, the vocabulary projection over the response window;
- prefill / decode: a rollout batch (`rl.tasks_per_step × rl.group_size` rows, in chunks of at
  most `sampler.max_batch`) with prompts of `max_prompt_tokens` and `max_new_tokens` to generate,
  on the sampler's inference copy of the weights.

Bytes per device are arguments + outputs − donated (aliased) buffers + temporaries (for bfloat16
compute on the CPU backend, temporaries of the float32-compute compile: see `plan`). The parameters
and optimizer state stay resident while sampling, so `sampling_peak_bytes_per_device` adds them to
the larger of prefill and decode; with `rl.max_staleness` > 0 (rollouts beside the update),
`async_peak_bytes_per_device` is the train step plus the larger of prefill and decode, plus one
weight snapshot per further step of staleness. CPU compilation stands in for the accelerator's:
layouts and fusion differ somewhat (expect temporaries within tens of percent). The last stdout line is JSON
with `devices, params, train_bytes_per_device, prefill_bytes_per_device, decode_bytes_per_device,
compile_s` and more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from skilljax.tools import request_host_devices

GB = 1e9


def _bytes(compiled) -> int:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes)


def model_config(c):
    """The QwenConfig the run would build (a preset's or an HF directory's config.json)."""
    from pathlib import Path

    from skilljax.experiment import model_overrides
    from skilljax.models import hf_io, qwen
    overrides = dict(model_overrides(c), dtype=c.model.dtype)
    if Path(c.model.checkpoint).is_dir():
        return hf_io.read_config(c.model.checkpoint, **overrides)
    if c.model.checkpoint not in qwen.PRESETS:
        raise ValueError(f"model.checkpoint={c.model.checkpoint!r} is neither an HF directory nor a "
                         f"preset ({sorted(qwen.PRESETS)}).")
    return qwen.PRESETS[c.model.checkpoint].replace(**overrides)


def _compile(c, cfg, layout) -> dict:
    """Compile the learner's mini-batch step and the sampler's prefill and decode for model `cfg`
    at the shapes of config `c`: {name: (compiled, seconds)} plus the shapes and state bytes."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from skilljax import experiment
    from skilljax import sharding as shd
    from skilljax.models import qwen
    from skilljax.rl import learner as learner_lib
    from skilljax.rl.batch import Batch
    from skilljax.sampling import Sampler, bucket_length

    mesh = layout.mesh
    lcfg = experiment.learner_config(c)
    out = {}

    def build():
        model = qwen.Qwen(cfg, layout, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, learner_lib.make_optimizer(lcfg),
                                    wrt=qwen.trainable(cfg))
    model, optimizer = nnx.eval_shape(build)
    model_def, model_state = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)
    model = nnx.merge(model_def, shd.abstract_state(model_state, layout))
    optimizer = nnx.merge(opt_def, shd.abstract_state(opt_state, layout))
    out["trainable_params"] = sum(v.size for _, v in nnx.state(model, qwen.trainable(cfg)).flat_state())
    prompt = c.prompt.max_prompt_tokens or cfg.max_position_embeddings - c.rl.max_new_tokens
    seq = bucket_length(prompt + c.rl.max_new_tokens)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    _, rows = learner_lib._rows(lcfg.mini_batch_size or c.rl.tasks_per_step * c.rl.group_size,
                                lcfg, shards)
    window = bucket_length(c.rl.max_new_tokens) if lcfg.response_window else None

    def arr(shape, dtype):
        axes = ("batch",) + (None,) * (len(shape) - 1)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=layout.sharding(shape, axes))
    batch = Batch(arr((rows, seq), jnp.int32), arr((rows, seq), jnp.int32),
                  arr((rows, seq), jnp.int32), arr((rows, seq), jnp.float32),
                  arr((rows,), jnp.float32), arr((rows, seq), jnp.float32))
    out["train_state_bytes_per_device"] = sum(
        math.prod(v.get_value().sharding.shard_shape(v.shape)) * v.dtype.itemsize
        for tree in (nnx.state(model), nnx.state(optimizer)) for _, v in tree.flat_state())
    t0 = time.perf_counter()
    train = learner_lib._mini_batch_step.lower(model, optimizer, batch, lcfg, window).compile()
    out["train"] = (train, time.perf_counter() - t0)
    out["train_shape"] = {"rows": rows, "micro_batch": lcfg.micro_batch_size or rows,
                          "seq": seq, "window": window}

    sampler = Sampler(model, max_batch=c.sampler.max_batch or None)
    rollout_rows = c.rl.tasks_per_step * c.rl.group_size
    chunks = -(-rollout_rows // (sampler.max_batch or rollout_rows))
    chunk = -(-rollout_rows // chunks)
    t0 = time.perf_counter()
    prefill, decode = sampler.lower(chunk, prompt, c.rl.max_new_tokens)
    out["prefill"] = (prefill.compile(), time.perf_counter() - t0)
    t0 = time.perf_counter()
    out["decode"] = (decode.compile(), time.perf_counter() - t0)
    out["sampler_shape"] = {"rows": sampler._batch_bucket(chunk), "chunks": chunks,
                            "prompt": bucket_length(prompt),
                            "new_tokens": bucket_length(c.rl.max_new_tokens),
                            "inference_layout": None if sampler.layout is None else sampler.layout.name}
    return out


def plan(c) -> dict:
    """The memory plan of config `c` on its mesh (`c.mesh`); see the module doc."""
    import jax

    from skilljax import sharding as shd

    cfg = model_config(c)
    layout = shd.Layout(shd.make_mesh(c.mesh or "fsdp=1"), "fsdp_tp")
    compiled = _compile(c, cfg, layout)
    out = {"devices": layout.mesh.size, "mesh": dict(layout.mesh.shape), "params": cfg.num_params(),
           "trainable_params": compiled["trainable_params"], "dtype": cfg.dtype,
           "param_dtype": cfg.param_dtype, "remat": cfg.remat, "scan_layers": cfg.scan_layers,
           "lora_rank": cfg.lora_rank, "backend": jax.default_backend()}
    # XLA:CPU computes bfloat16 in float32 and hoists float32 copies of whole weight and cache
    # arrays out of loops (measured: 7B decode on fsdp=8, 39.9 GB of temporaries in bfloat16 vs
    # 1.3 GB in float32), which no accelerator does. So temporaries come from the same program
    # compiled with float32 compute, an upper bound of the bfloat16 one's (every activation twice
    # as wide); arguments and outputs are the bfloat16 program's own.
    temps_from = compiled
    if cfg.dtype != "float32" and jax.default_backend() == "cpu":
        temps_from = _compile(c, cfg.replace(dtype="float32"), layout)
        out["temporaries_from"] = "float32-compute compile (XLA:CPU upcasts bfloat16)"
    for name in ("train", "prefill", "decode"):
        exe, seconds = compiled[name]
        m, m_temps = exe.memory_analysis(), temps_from[name][0].memory_analysis()
        out[f"{name}_bytes_per_device"] = int(
            m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m_temps.temp_size_in_bytes)
        out[f"{name}_cpu_raw_bytes_per_device"] = _bytes(exe)
        out[f"{name}_compile_s"] = seconds
    out["train_state_bytes_per_device"] = compiled["train_state_bytes_per_device"]
    out["train_shape"], out["sampler_shape"] = compiled["train_shape"], compiled["sampler_shape"]
    # Parameters and optimizer state stay resident while the sampler runs.
    out["sampling_peak_bytes_per_device"] = out["train_state_bytes_per_device"] + max(
        out["prefill_bytes_per_device"], out["decode_bytes_per_device"])
    if c.rl.max_staleness:  # rollouts run beside the update (skilljax.rl.ahead): both at once,
        # plus a weight snapshot (compute dtype, tensor-parallel layout) per further started step
        import jax.numpy as jnp

        from skilljax.models import qwen
        snapshot = (cfg.num_params() * jnp.dtype(qwen.DTYPES[cfg.dtype]).itemsize
                    // layout.mesh.shape["tensor"])
        out["async_peak_bytes_per_device"] = (
            out["train_bytes_per_device"] + max(out["prefill_bytes_per_device"],
                                                out["decode_bytes_per_device"])
            + (c.rl.max_staleness - 1) * snapshot)
    out["compile_s"] = sum(compiled[k][1] for k in ("train", "prefill", "decode"))
    return out


def table(p: dict) -> str:
    rows = [("parameters", f"{p['params'] / 1e9:.2f} B ({p['trainable_params'] / 1e9:.3f} B trained)"),
            ("mesh", ", ".join(f"{k}={v}" for k, v in p["mesh"].items())),
            ("dtypes", f"compute {p['dtype']}, parameters {p['param_dtype']}, remat {p['remat']}, "
                       f"scan {p['scan_layers']}, LoRA rank {p['lora_rank']}"),
            ("train step", f"{p['train_bytes_per_device'] / GB:.2f} GB/device "
                           f"({p['train_shape']}, compiled in {p['train_compile_s']:.1f} s)"),
            ("  of which state", f"{p['train_state_bytes_per_device'] / GB:.2f} GB/device "
                                 "(parameters + optimizer)"),
            ("prefill", f"{p['prefill_bytes_per_device'] / GB:.2f} GB/device ({p['sampler_shape']})"),
            ("decode", f"{p['decode_bytes_per_device'] / GB:.2f} GB/device "
                       f"(compiled in {p['decode_compile_s']:.1f} s)"),
            ("sampling peak", f"{p['sampling_peak_bytes_per_device'] / GB:.2f} GB/device "
                              "(state resident + the larger of prefill and decode)")]
    if "async_peak_bytes_per_device" in p:
        rows.append(("async peak", f"{p['async_peak_bytes_per_device'] / GB:.2f} GB/device "
                                   "(rl.max_staleness: train step + sampling beside it)"))
    return "\n".join(f"{k:<16} {v}" for k, v in rows)


def summary(directory) -> str:
    """A markdown table of the plans saved as DIR/*.json (their last-line JSON)."""
    from pathlib import Path
    lines = ["| plan | params (trained) | train | prefill | decode | sampling peak | compile (train) |",
             "|---|---|---|---|---|---|---|"]
    for f in sorted(Path(directory).glob("*.json")):
        p = json.loads(f.read_text())
        gb = lambda k: f"{p[k] / GB:.1f} GB"
        lines.append(f"| {f.stem} | {p['params'] / 1e9:.2f} B ({p['trainable_params'] / 1e9:.3f} B) "
                     f"| {gb('train_bytes_per_device')} | {gb('prefill_bytes_per_device')} "
                     f"| {gb('decode_bytes_per_device')} | {gb('sampling_peak_bytes_per_device')} "
                     f"| {p['train_compile_s']:.1f} s |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="configs/x.py[:arg]; checkpoint= may be a preset")
    p.add_argument("--mesh", help="e.g. fsdp=8 or data=2,fsdp=4")
    p.add_argument("--summary", metavar="DIR", help="print a table of the plans saved in DIR/*.json")
    args, overrides = p.parse_known_args(argv)
    if args.summary:
        print(summary(args.summary))
        return
    if not (args.config and args.mesh):
        p.error("--config and --mesh are required (or --summary DIR)")
    # Fake CPU devices for the mesh; set before JAX starts.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    request_host_devices(args.mesh)

    from skilljax import config as config_lib
    c = config_lib.load_config(args.config, overrides)
    c.mesh = args.mesh
    result = plan(c)
    print(table(result))
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
