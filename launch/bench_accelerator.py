"""Accelerator benchmark: sampler decode throughput against the HBM-bandwidth roofline and learner
throughput / MFU, on one GPU or TPU chip with random weights. Runs in a few minutes.

    python launch/bench_accelerator.py                 # the full benchmark (one chip)
    python launch/bench_accelerator.py --smoke         # tiny presets, seconds, any backend (CI)

Sampler: `qwen2p5_0p5b` and `qwen2p5_1p5b` in bfloat16 at batch 64 and 256, prompts of
`--prompt-len` tokens, `--new-tokens` generated per row (no stop token: every row decodes every
step). Roofline: one decode step must read every weight once and each row's KV cache up to its
current length; the step time that bandwidth allows is bytes / HBM bandwidth, and the reported
fraction is that time over the measured one. The bandwidth is both the chip's specification (table
below, by `device_kind`) and a copy kernel measured in the same run.

Learner: `qwen2p5_1p5b`, float32 master weights, bfloat16 compute, remat `full`, one AdamW step
on `--train-rows` sequences of `--seq-len` tokens (responses the last quarter), after a warm-up
step. MFU = (6 · N + 12 · layers · heads · head_dim · seq) FLOPs per token (forward + backward,
attention over the full length, remat's recomputation not counted) × tokens/s / the chip's dense
bfloat16 peak.

The last stdout line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Specifications per chip (device_kind prefix → (HBM bytes/s, dense bfloat16 FLOP/s)).
CHIPS = {
    "NVIDIA H200": (4.8e12, 989e12),
    "NVIDIA H100 PCIe": (2.0e12, 756e12),
    "NVIDIA H100": (3.35e12, 989e12),  # SXM
    "NVIDIA A100-SXM4-80GB": (2.04e12, 312e12),
    "NVIDIA A100": (1.56e12, 312e12),
    "NVIDIA L4": (0.3e12, 121e12),
    "TPU v4": (1.2e12, 275e12),
    "TPU v5 lite": (0.819e12, 197e12),  # v5e
    "TPU v5": (2.765e12, 459e12),  # v5p
    "TPU v6 lite": (1.64e12, 918e12),  # v6e
}


def chip_spec(kind: str) -> tuple[float | None, float | None]:
    for prefix in sorted(CHIPS, key=len, reverse=True):
        if kind.startswith(prefix):
            return CHIPS[prefix]
    return None, None


def measured_bandwidth(nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes/s of x → x + 1 over a float32 array (one read and one write per element), best of."""
    import jax
    import jax.numpy as jnp
    x = jnp.zeros(nbytes // 4, jnp.float32)
    f = jax.jit(lambda a: a + 1, donate_argnums=0)
    x = f(x).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x = f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def bench_decode(preset: str, batch: int, prompt_len: int, new_tokens: int, dtype: str) -> dict:
    import jax
    import numpy as np

    from skilljax import models
    from skilljax.sampling import Sampler, SamplingParams
    cfg, model = models.load(preset, dtype=dtype, param_dtype=dtype, seed=0)
    sampler = Sampler(model)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg.vocab_size, (batch, prompt_len)).tolist()
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    t0 = time.perf_counter()
    sampler.generate(prompts, params, jax.random.key(0))
    compile_s = time.perf_counter() - t0
    sampler.generate(prompts, params, jax.random.key(1))
    timing = sampler.last_timing
    itemsize = np.dtype(model.embedding.get_value().dtype).itemsize
    weight_bytes = cfg.num_params() * itemsize
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
    mean_context = prompt_len + new_tokens / 2
    step_bytes = weight_bytes + batch * mean_context * kv_per_token
    steps_per_s = new_tokens / timing["decode_s"]
    del sampler, model
    return {"preset": preset, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "decode_tokens_per_s": timing["decode_tokens"] / timing["decode_s"],
            "prefill_tokens_per_s": timing["prefill_tokens"] / timing["prefill_s"],
            "bytes_per_step": step_bytes, "achieved_bytes_per_s": step_bytes * steps_per_s,
            "compile_s": compile_s}


def bench_train(preset: str, rows: int, seq_len: int, remat: str, dtype: str) -> dict:
    import numpy as np

    from skilljax import models
    from skilljax.rl import batch as batch_lib
    from skilljax.rl.learner import Learner, LearnerConfig, response_window
    cfg, model = models.load(preset, dtype=dtype, remat=remat, seed=0)
    learner = Learner(model, LearnerConfig(learning_rate=1e-6, micro_batch_size=None))
    rng = np.random.default_rng(0)
    response = seq_len // 4
    loss = np.zeros((rows, seq_len), np.int32)
    loss[:, -response:] = 1
    host = {"tokens_BT": rng.integers(0, cfg.vocab_size, (rows, seq_len)).astype(np.int32),
            "loss_mask_BT": loss, "attn_mask_BT": np.ones((rows, seq_len), np.int32),
            "old_logp_BT": np.full((rows, seq_len), -5.0, np.float32),
            "advantages_B": rng.normal(size=rows).astype(np.float32),
            "ref_logp_BT": np.zeros((rows, seq_len), np.float32)}
    window = response_window(loss)
    batch = batch_lib.place_batch(host, model.layout)
    t0 = time.perf_counter()
    learner._step(batch, window)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(3):
        batch = batch_lib.place_batch(host, model.layout)
        t0 = time.perf_counter()
        learner._step(batch, window)  # returns floats: synchronised
        times.append(time.perf_counter() - t0)
    step_s = min(times)
    tokens_per_s = rows * seq_len / step_s
    flops_per_token = 6 * cfg.num_params() + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    del learner, model
    return {"preset": preset, "rows": rows, "seq_len": seq_len, "remat": remat,
            "step_s": step_s, "tokens_per_s": tokens_per_s,
            "flops_per_s": flops_per_token * tokens_per_s, "compile_s": compile_s}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--decode-presets", default="qwen2p5_0p5b,qwen2p5_1p5b")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--train-preset", default="qwen2p5_1p5b")
    p.add_argument("--train-rows", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--remat", default="full")
    p.add_argument("--smoke", action="store_true",
                   help="tiny presets and sizes (checks the script on any backend, CPU included)")
    args = p.parse_args(argv)
    dtype = "bfloat16"
    if args.smoke:
        args.decode_presets, args.batches, args.train_preset = "tiny", "4", "tiny"
        args.prompt_len, args.new_tokens, args.train_rows, args.seq_len = 16, 8, 2, 64
        dtype = "float32"

    import jax
    device = jax.devices()[0]
    kind = device.device_kind
    spec_bw, spec_flops = chip_spec(kind)
    bw = measured_bandwidth(1 << (22 if args.smoke else 30))
    out = {"device": kind, "backend": jax.default_backend(), "devices": jax.device_count(),
           "spec_hbm_bytes_per_s": spec_bw, "measured_bytes_per_s": bw,
           "spec_bf16_flops": spec_flops, "decode": [], "train": None}
    t_start = time.perf_counter()
    for preset in args.decode_presets.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            r = bench_decode(preset, batch, args.prompt_len, args.new_tokens, dtype)
            r["roofline_fraction_measured_bw"] = r["achieved_bytes_per_s"] / bw
            if spec_bw:
                r["roofline_fraction_spec_bw"] = r["achieved_bytes_per_s"] / spec_bw
            out["decode"].append(r)
            print(f"decode {preset} batch {batch}: {r['decode_tokens_per_s']:.0f} tok/s, "
                  f"{r['roofline_fraction_measured_bw']:.1%} of the measured bandwidth roofline",
                  flush=True)
    r = bench_train(args.train_preset, args.train_rows, args.seq_len, args.remat, dtype)
    if spec_flops:
        r["mfu"] = r["flops_per_s"] / spec_flops
    out["train"] = r
    print(f"train {args.train_preset}: {r['tokens_per_s']:.0f} tok/s"
          + (f", MFU {r['mfu']:.1%}" if spec_flops else ""), flush=True)
    out["wall_s"] = time.perf_counter() - t_start
    print(json.dumps(out))


if __name__ == "__main__":
    main()
