"""Train-step benchmark: tokens/s of the GRPO update and its fraction of this machine's matmul peak.

    python -m skilljax.tools.bench_train [--configs tiny,small] [--batch 16] [--seq-len 128]
        [--response-len 64] [--micro-batch 0] [--repeats 5] [--remat] [--logits-block N]

Each config is timed twice in the same run: with the vocabulary projection over every position
(the baseline) and only over the response window (`LearnerConfig.response_window`, the default);
agent step samples have long prompts and short responses (e.g. `--seq-len 128 --response-len 16`).

FLOPs per token are counted as computed: 6 × (matmul weights incl. the LM head) for forward and
backward, plus attention over the full padded length (the causal mask does not skip work):
3 × 4 · layers · heads · head_dim · seq_len. The peak is a float32 1024² GEMM measured in the same
run. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def train_flops_per_token(cfg, seq_len: int) -> float:
    weights = cfg.num_params() - cfg.vocab_size * cfg.embed_dim * (0 if cfg.tie_embeddings else 1)
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    return 3 * (2 * weights + attn)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="tiny,small")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--response-len", type=int, default=0, help="0: half the sequence")
    p.add_argument("--micro-batch", type=int, default=0, help="0: no accumulation")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--remat", action="store_true")
    p.add_argument("--logits-block", type=int, default=None,
                   help="the model's logits_block (positions per vocabulary projection; 0 = all)")
    args = p.parse_args(argv)

    import jax.numpy as jnp
    import numpy as np

    from skilljax import models
    from skilljax.rl.learner import Batch, Learner, LearnerConfig
    from skilljax.tools.bench_sampler import matmul_peak_flops

    peak = matmul_peak_flops()
    print(f"float32 matmul peak on this machine: {peak / 1e9:.1f} GFLOP/s")
    results = {"matmul_peak_gflops": peak / 1e9, "configs": {}}
    for name in args.configs.split(","):
        b, t = args.batch, args.seq_len
        r = args.response_len or t // 2
        row = {}
        for mode in ("full", "window"):
            extra = {} if args.logits_block is None else {"logits_block": args.logits_block}
            cfg, model = models.load(name, seed=0, remat=args.remat, **extra)
            # The optimiser step alone: the batch's old logprobs, not the recomputing forward.
            learner = Learner(model, LearnerConfig(learning_rate=1e-5,
                                                   micro_batch_size=args.micro_batch or None,
                                                   response_window=mode == "window",
                                                   recompute_old_logp=False))
            rng = np.random.default_rng(0)
            loss_mask = np.zeros((b, t), np.int32)
            loss_mask[:, t - r:] = 1  # prompt, then the response
            batch = Batch(jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t))),
                          jnp.asarray(loss_mask), jnp.ones((b, t), jnp.int32),
                          jnp.asarray(rng.normal(-np.log(cfg.vocab_size), 0.1, (b, t)),
                                      jnp.float32),
                          jnp.asarray(rng.normal(size=b), jnp.float32))
            t0 = time.perf_counter()
            learner.update(batch)
            cold = time.perf_counter() - t0
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                learner.update(batch)  # returns host floats, so the step is finished
                times.append(time.perf_counter() - t0)
            step_s = statistics.median(times)
            tokens_per_s = b * t / step_s
            # FLOPs of the full computation, so the fraction shows the time saved as a gain.
            frac = tokens_per_s * train_flops_per_token(cfg, t) / peak
            row[mode] = {"step_s": step_s, "tokens_per_s": tokens_per_s,
                         "compile_s": cold - step_s, "peak_fraction": frac}
            print(f"{name:6s} {mode:6s} {cfg.num_params() / 1e6:6.2f}M params | "
                  f"{tokens_per_s:8.0f} tokens/s (step {step_s * 1e3:.0f} ms, B={b}, T={t}, "
                  f"response {r}), compile {cold - step_s:.1f}s, "
                  f"{100 * frac:.1f}% of matmul peak (full-computation FLOPs)", flush=True)
        row.update(params=cfg.num_params(),
                   window_speedup=row["full"]["step_s"] / row["window"]["step_s"])
        print(f"{name:6s} response window: {row['window_speedup']:.2f}x the full projection",
              flush=True)
        results["configs"][name] = row
    print(json.dumps(results))


if __name__ == "__main__":
    main()
