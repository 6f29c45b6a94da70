"""Tunix's native sampler on bench_sampler's presets: the comparison issue #3 asks for.

Tunix is not a project dependency; run this in a scratch environment, right before or after
`python -m skilljax.tools.bench_sampler` on the same idle machine:

    python3 -m venv /tmp/tunixenv && /tmp/tunixenv/bin/pip install google-tunix
    /tmp/tunixenv/bin/python launch/bench_tunix.py tiny,small

Same shapes as bench_sampler (batch 16, 16-token prompts, 64 new tokens, top-p 0.95 / top-k 20,
no stop token) on Tunix's Qwen2 module with random weights (throughput does not depend on them).
Prints end-to-end tokens/s per preset (median of 7 warm calls), then one JSON line.
"""
import json
import sys
import time

import numpy as np
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen2 import model as qwen2

# skilljax.models.qwen.PRESETS "tiny" and "small", in Tunix's field names.
PRESETS = {
    "tiny": dict(num_layers=2, vocab_size=512, embed_dim=128, hidden_dim=320, num_heads=4,
                 head_dim=32, num_kv_heads=2),
    "small": dict(num_layers=8, vocab_size=32000, embed_dim=512, hidden_dim=1536, num_heads=8,
                  head_dim=64, num_kv_heads=4),
}
BATCH, PROMPT, NEW, REPEATS = 16, 16, 64, 7


class IdTokenizer:
    """Prompts are space-separated token ids; 0 pads (and is no BOS), no EOS is ever sampled."""

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


def bench(name: str) -> dict:
    cfg = qwen2.ModelConfig(**PRESETS[name], rope_theta=10000, norm_eps=1e-6,
                            use_tied_embedding=False)
    model = qwen2.Qwen2(cfg, rngs=nnx.Rngs(0))
    sampler = sampler_lib.Sampler(model, IdTokenizer(), sampler_lib.CacheConfig(
        cache_size=PROMPT + NEW, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim))
    rng = np.random.default_rng(0)
    prompts = [" ".join(map(str, rng.integers(2, cfg.vocab_size, PROMPT))) for _ in range(BATCH)]

    def call(seed):
        return sampler(prompts, max_generation_steps=NEW, max_prompt_length=PROMPT,
                       temperature=1.0, top_p=0.95, top_k=20, seed=seed, eos_tokens=[-1])

    t0 = time.perf_counter()
    tokens = sum(len(t) for t in call(0).tokens)
    cold = time.perf_counter() - t0
    times = []
    for i in range(REPEATS):
        t0 = time.perf_counter()
        call(i + 1)
        times.append(time.perf_counter() - t0)
    rate = tokens / float(np.median(times))
    print(f"tunix {name}: e2e {rate:.0f} tok/s ({tokens} tokens, median of {REPEATS}), "
          f"first call {cold:.1f}s", flush=True)
    return dict(e2e_tokens_per_s=rate, tokens=tokens, cold_s=cold)


if __name__ == "__main__":
    print(json.dumps({name: bench(name) for name in sys.argv[1].split(",")}))
