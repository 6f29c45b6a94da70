"""Sampler benchmark: skilljax against `transformers` generate and Tunix's sampler, same run.

    python -m skilljax.tools.bench_sampler [--configs tiny,small] [--batch 16] [--prompt-len 16]
        [--new-tokens 64] [--top-p 0.95] [--top-k 20] [--repeats 7]
    python -m skilljax.tools.bench_sampler --rollout-shapes 2x8 [--shared-prefix 256] ...

For each preset: random weights (seed 0) exported to a temporary HF directory and loaded by
transformers; both sample B×new tokens with the same top-p/top-k (no stop tokens, every row runs
to the limit). Reported: warm decode tokens/s (prefill excluded: for transformers the time of a
prompt forward pass is subtracted), end-to-end tokens/s, their ratios, compile time, and for
skilljax the fraction of this machine's float32 matmul peak (measured here) that decoding reaches,
and of its bandwidth limit: decoding reads every weight once per step, so at best batch × (bytes/s
of a sum over a float32 array twice the weights' size, measured here) / weight bytes tokens/s.
When `tunix` is importable (a venv with google-tunix), Tunix's sampler runs the same requests on
its Qwen3 module at the preset's shapes; both are then timed by wall clock (prefill ≈ a one-token
call) and their ratios printed. The last stdout line is JSON with everything.

`--rollout-shapes TxG`: generate wall time on T tasks x G rollouts whose prompts share their
task's first tokens and whose rows stop at spread-out steps, with shared-prefix prefill and
compaction each on and off (ratios against both off, same run; `rollout_shapes`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def _best_seconds(f, x, reps: int) -> float:
    """The fastest of `reps` timed calls of jitted `f(x)` (after one untimed)."""
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_peak_flops(n: int = 1024, reps: int = 20) -> float:
    """Best-of float32 GEMM throughput on the default JAX device."""
    import jax
    import jax.numpy as jnp
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    return 2 * n ** 3 / _best_seconds(jax.jit(lambda x: x @ x), a, reps)


def decode_flops_per_token(cfg, context: int) -> float:
    """Matmul FLOPs of one decode step per row: weights (incl. LM head) plus attention over `context`."""
    weights = cfg.num_params() - cfg.vocab_size * cfg.embed_dim * (0 if cfg.tie_embeddings else 1)
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
    return 2 * weights + attn


class SkilljaxRunner:
    def __init__(self, model, prompts, new_tokens, top_p, top_k):
        import jax

        from skilljax.sampling import Sampler, SamplingParams
        self.jax, self.prompts = jax, prompts
        self.sampler = Sampler(model)
        self.params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=top_p,
                                     top_k=top_k)
        t0 = time.perf_counter()
        self.run(0)
        self.cold_s = time.perf_counter() - t0

    def run(self, seed):
        """(prefill seconds, decode seconds, generated tokens)."""
        out = self.sampler.generate(self.prompts, self.params, self.jax.random.key(seed))
        t = self.sampler.last_timing
        return t["prefill_s"], t["decode_s"], int(out.lengths.sum())

    def run_wall(self, seed):
        """As `TunixRunner.run`: wall clock of whole calls, prefill ≈ a call for one token."""
        import dataclasses
        one = dataclasses.replace(self.params, max_new_tokens=1)
        t0 = time.perf_counter()
        self.sampler.generate(self.prompts, one, self.jax.random.key(seed))
        t1 = time.perf_counter()
        out = self.sampler.generate(self.prompts, self.params, self.jax.random.key(seed))
        t2 = time.perf_counter()
        return t1 - t0, (t2 - t1) - (t1 - t0), int(out.lengths.sum())


def memory_bandwidth(nbytes: int, reps: int = 10) -> float:
    """Bytes/s at which this machine streams a float32 array of `nbytes` through a sum (best of
    `reps`): the rate a decode step can at best read its weights at."""
    import jax
    import jax.numpy as jnp
    a = jnp.ones((nbytes // 4,), jnp.float32)
    return a.nbytes / _best_seconds(jax.jit(jnp.sum), a, reps)


class TunixRunner:
    """Tunix's sampler (`tunix.generate.sampler.Sampler`, when installed) on Tunix's Qwen3 module
    with this preset's shapes (tied or not as the preset), random weights (throughput does not
    depend on them). Prompts are token ids written as text for an id tokenizer."""

    def __init__(self, cfg, prompts, new_tokens, top_p, top_k):
        from flax import nnx
        from tunix.generate import sampler as sampler_lib
        from tunix.models.qwen3 import model as qwen3

        class IdTokenizer:  # 0 pads (and is no BOS); no EOS is ever sampled
            def encode(self, text, **kw):
                return [int(x) for x in text.split()]

            def decode(self, ids, **kw):
                return " ".join(map(str, ids))

            def bos_id(self):
                return 0

            def eos_id(self):
                return 1

            def pad_id(self):
                return 0

        tcfg = qwen3.ModelConfig(
            num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.embed_dim,
            hidden_dim=cfg.mlp_dim, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
            num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta),
            norm_eps=cfg.rms_norm_eps, use_tied_embedding=cfg.tie_embeddings)
        model = qwen3.Qwen3(tcfg, rngs=nnx.Rngs(0))
        self.prompt_len = len(prompts[0])
        self.sampler = sampler_lib.Sampler(model, IdTokenizer(), sampler_lib.CacheConfig(
            cache_size=self.prompt_len + new_tokens, num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
        self.texts = [" ".join(map(str, p)) for p in prompts]
        self.new_tokens, self.top_p, self.top_k = new_tokens, top_p, top_k
        t0 = time.perf_counter()
        self.call(0, new_tokens), self.call(0, 1)
        self.cold_s = time.perf_counter() - t0

    def call(self, seed, steps):
        out = self.sampler(self.texts, max_generation_steps=steps,
                           max_prompt_length=self.prompt_len, temperature=1.0, top_p=self.top_p,
                           top_k=self.top_k, seed=seed, eos_tokens=[-1])
        return sum(len(t) for t in out.tokens)

    def run(self, seed):
        """(prefill seconds ≈ a call for one token, decode seconds, generated tokens), wall clock
        of the whole call (its host work included, as for `SkilljaxRunner.run_wall`)."""
        t0 = time.perf_counter()
        self.call(seed, 1)
        t1 = time.perf_counter()
        tokens = self.call(seed, self.new_tokens)
        t2 = time.perf_counter()
        return t1 - t0, (t2 - t1) - (t1 - t0), tokens


class TransformersRunner:
    def __init__(self, path, prompts, new_tokens, top_p, top_k):
        import torch
        import transformers
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.ids = torch.tensor(prompts)
        self.mask = torch.ones_like(self.ids)
        self.kw = dict(attention_mask=self.mask, do_sample=True, top_p=top_p, top_k=top_k,
                       temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       pad_token_id=0)
        self.run(0)  # warm-up

    def run(self, seed):
        """(prefill seconds, decode seconds, generated tokens); decode = generate − a prompt forward
        (the faster of one timed before and one after, less exposed to a busy machine)."""
        torch = self.torch
        torch.manual_seed(seed)
        with torch.no_grad():
            t0 = time.perf_counter()
            self.model(self.ids, attention_mask=self.mask)
            t1 = time.perf_counter()
            out = self.model.generate(self.ids, **self.kw)
            t2 = time.perf_counter()
            self.model(self.ids, attention_mask=self.mask)
            t3 = time.perf_counter()
        prefill = min(t1 - t0, t3 - t2)
        return prefill, (t2 - t1) - prefill, (out.shape[1] - self.ids.shape[1]) * self.ids.shape[0]


def summarize(runs):
    prefill = statistics.median(r[0] for r in runs)
    decode = statistics.median(r[1] for r in runs)
    tokens = runs[-1][2]
    if decode <= 0:
        raise RuntimeError(f"Measured decode time {decode:.4f} s <= 0: the prompt forward took as "
                           "long as generation, so timing noise (a busy machine) swamps the decode; "
                           "rerun on an idle machine or raise --new-tokens / --repeats.")
    return {"decode_tokens_per_s": tokens / decode, "e2e_tokens_per_s": tokens / (prefill + decode),
            "tokens": tokens}


def rollout_shapes(model, cfg, tasks: int, group: int, prefix: int, new_tokens: int,
                   repeats: int) -> dict:
    """Generate wall time on rollout-shaped requests, with each sampler feature on and off, same
    run: `tasks` × `group` prompts whose first `prefix` tokens are their task's (a task's G
    rollouts: task and skill text) plus 8-40 own tokens (history), and stop ids drawn from what
    the rows emit without any, so rows end at spread-out steps as a policy's responses do."""
    import jax
    import numpy as np

    from skilljax.sampling import Sampler, SamplingParams
    rng = np.random.default_rng(1)
    heads = [rng.integers(3, cfg.vocab_size, prefix).tolist() for _ in range(tasks)]
    prompts = [h + rng.integers(3, cfg.vocab_size, int(rng.integers(8, 41))).tolist()
               for h in heads for _ in range(group)]
    keys = jax.random.split(jax.random.key(0), len(prompts))
    free = Sampler(model, share_prefix_min=0, compact=False).generate(
        prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_k=20), keys)
    steps = np.linspace(1, new_tokens - 1, 8).astype(int)
    stops = tuple(sorted({free.token_ids[i][k] for i, k in enumerate(steps)}))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_k=20,
                            stop_token_ids=stops)
    variants = {"neither": dict(share_prefix_min=0, compact=False),
                "shared_prefix": dict(compact=False), "compaction": dict(share_prefix_min=0),
                "both": {}}
    samplers = {k: Sampler(model, **kw) for k, kw in variants.items()}
    times = {k: [] for k in variants}
    outs = {}
    for k, sampler in samplers.items():  # compile every shape first
        outs[k] = sampler.generate(prompts, params, keys)
    for r in range(repeats):  # interleaved, so drift in the machine's speed hits all alike
        for k, sampler in samplers.items():
            t0 = time.perf_counter()
            sampler.generate(prompts, params, keys)
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["neither"])
    row = {"rows": len(prompts), "prompt_tokens": sum(map(len, prompts)),
           "generated_tokens": int(outs["neither"].lengths.sum()),
           "max_tokens": len(prompts) * new_tokens,
           "same_tokens": all(o.token_ids == outs["neither"].token_ids for o in outs.values())}
    for k in variants:
        row[k] = {"generate_s": statistics.median(times[k]),
                  "speedup": base / statistics.median(times[k])}
    row["prefill_tokens_computed"] = samplers["both"].last_timing["prefill_tokens_computed"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="tiny,small")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--skip-tunix", action="store_true",
                   help="do not compare with Tunix's sampler even when tunix is installed")
    p.add_argument("--rollout-shapes", default="",
                   help="TASKSxGROUP (e.g. 2x8): instead of the comparison, time rollout-shaped "
                        "requests with shared-prefix prefill and compaction on and off")
    p.add_argument("--shared-prefix", type=int, default=256,
                   help="with --rollout-shapes: tokens each task's prompts share")
    args = p.parse_args(argv)
    if args.rollout_shapes:
        return _rollout_main(args)

    import numpy as np

    from skilljax import models
    from skilljax.models import hf_io

    peak = matmul_peak_flops()
    print(f"float32 matmul peak on this machine: {peak / 1e9:.1f} GFLOP/s")
    results = {"matmul_peak_gflops": peak / 1e9, "configs": {}}
    tunix = None
    if not args.skip_tunix:
        try:
            import tunix  # noqa: F401
            tunix = True
        except ImportError:
            print("tunix is not installed: no Tunix comparison (pip install google-tunix)")
    for name in args.configs.split(","):
        cfg, model = models.load(name, seed=0)
        rng = np.random.default_rng(0)
        prompts = rng.integers(3, cfg.vocab_size, (args.batch, args.prompt_len)).tolist()
        ours_runner = SkilljaxRunner(model, prompts, args.new_tokens, args.top_p, args.top_k)
        # Decoding streams every weight once per step: at this machine's rate, at best
        # batch × bandwidth / weight bytes tokens/s (float32 weights; measured in this run).
        weight_bytes = 4 * cfg.num_params()
        bandwidth = memory_bandwidth(max(2 * weight_bytes, 256 << 20))
        tunix_runner = (TunixRunner(cfg, prompts, args.new_tokens, args.top_p, args.top_k)
                        if tunix else None)
        ref_runner = None
        tmp = tempfile.TemporaryDirectory()
        if not args.skip_transformers:
            hf_io.export(model, f"{tmp.name}/hf", overwrite=True)
            ref_runner = TransformersRunner(f"{tmp.name}/hf", prompts, args.new_tokens, args.top_p,
                                            args.top_k)
        # Interleaved, so drift in this machine's speed hits both sides alike.
        ours_runs, ref_runs, wall_runs, tunix_runs = [], [], [], []
        if tunix_runner:
            ours_runner.run_wall(0)  # compiles the one-token call's shape
        for r in range(args.repeats):
            ours_runs.append(ours_runner.run(r + 1))
            if ref_runner:
                ref_runs.append(ref_runner.run(r + 1))
            if tunix_runner:
                wall_runs.append(ours_runner.run_wall(r + 1))
                tunix_runs.append(tunix_runner.run(r + 1))
        tmp.cleanup()
        ours = summarize(ours_runs)
        ours["compile_s"] = ours_runner.cold_s - sum(ours_runs[0][:2])
        context = args.prompt_len + args.new_tokens // 2
        ours["peak_fraction"] = (ours["decode_tokens_per_s"] * decode_flops_per_token(cfg, context)
                                 / peak)
        limit = args.batch * bandwidth / weight_bytes
        ours["bandwidth_limit_tokens_per_s"] = limit
        ours["bandwidth_fraction"] = ours["decode_tokens_per_s"] / limit
        row = {"params": cfg.num_params(), "skilljax": ours, "bandwidth_gb_s": bandwidth / 1e9}
        if tunix_runner:
            row["skilljax_wall"], row["tunix"] = summarize(wall_runs), summarize(tunix_runs)
            row["tunix"]["compile_s"] = tunix_runner.cold_s
            row["tunix_decode_ratio"] = (row["skilljax_wall"]["decode_tokens_per_s"]
                                         / row["tunix"]["decode_tokens_per_s"])
            row["tunix_e2e_ratio"] = (row["skilljax_wall"]["e2e_tokens_per_s"]
                                      / row["tunix"]["e2e_tokens_per_s"])
        if ref_runner:
            ref = summarize(ref_runs)
            row["transformers"] = ref
            row["decode_ratio"] = ours["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
            row["e2e_ratio"] = ours["e2e_tokens_per_s"] / ref["e2e_tokens_per_s"]
        results["configs"][name] = row
        line = (f"{name:6s} {cfg.num_params() / 1e6:6.2f}M params | skilljax decode "
                f"{ours['decode_tokens_per_s']:9.0f} tok/s, e2e {ours['e2e_tokens_per_s']:9.0f} tok/s, "
                f"compile {ours['compile_s']:.1f}s, {100 * ours['peak_fraction']:.1f}% of matmul peak, "
                f"{100 * ours['bandwidth_fraction']:.1f}% of the bandwidth limit "
                f"({limit:.0f} tok/s at {bandwidth / 1e9:.1f} GB/s)")
        if "tunix" in row:
            line += (f" | tunix decode {row['tunix']['decode_tokens_per_s']:8.0f} tok/s, e2e "
                     f"{row['tunix']['e2e_tokens_per_s']:8.0f} (skilljax, same wall-clock method: "
                     f"{row['skilljax_wall']['decode_tokens_per_s']:.0f} / "
                     f"{row['skilljax_wall']['e2e_tokens_per_s']:.0f}) | ratio decode "
                     f"{row['tunix_decode_ratio']:.2f}x, e2e {row['tunix_e2e_ratio']:.2f}x")
        if "transformers" in row:
            line += (f" | transformers decode {row['transformers']['decode_tokens_per_s']:8.0f} tok/s"
                     f", e2e {row['transformers']['e2e_tokens_per_s']:8.0f} | ratio decode "
                     f"{row['decode_ratio']:.2f}x, e2e {row['e2e_ratio']:.2f}x")
        print(line, flush=True)
    print(json.dumps(results))



def _rollout_main(args):
    from skilljax import models
    tasks, group = (int(x) for x in args.rollout_shapes.split("x"))
    results = {}
    for name in args.configs.split(","):
        cfg, model = models.load(name, seed=0)
        row = rollout_shapes(model, cfg, tasks, group, args.shared_prefix, args.new_tokens,
                             args.repeats)
        results[name] = row
        print(f"{name:6s} {row['rows']} rows, {row['prompt_tokens']} prompt tokens "
              f"({row['prefill_tokens_computed']} computed when shared), "
              f"{row['generated_tokens']}/{row['max_tokens']} tokens generated | "
              + ", ".join(f"{k} {row[k]['generate_s']:.3f}s ({row[k]['speedup']:.2f}x)"
                          for k in ("neither", "shared_prefix", "compaction", "both"))
              + f" | same tokens: {row['same_tokens']}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
