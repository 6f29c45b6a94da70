"""Generate from token-id prompts: `python -m skilljax.tools.generate --checkpoint DIR --prompts IN.jsonl --out OUT.jsonl`.

IN.jsonl holds one {"token_ids": [...]} per line; OUT.jsonl gets one {"token_ids", "logprobs"} per
prompt (generated tokens only, through the first EOS). With --repeat R the batch is generated R
times and the last stdout line is JSON with decode/prefill tokens per second over the calls after
the first, and the compile time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from skilljax.tools import request_host_devices


def stop_ids(checkpoint: str, cfg) -> tuple[int, ...]:
    """EOS ids from config.json and, if present, generation_config.json (what HF generate uses)."""
    ids = list(cfg.eos_token_ids)
    gen = Path(checkpoint) / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return tuple(dict.fromkeys(ids))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="HF directory or preset name")
    p.add_argument("--prompts", required=True, help="jsonl of {\"token_ids\": [...]}")
    p.add_argument("--out", required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, required=True, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--mesh", default=None, help="e.g. data=2,fsdp=2,tensor=2")
    p.add_argument("--layout", default="fsdp_tp")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: as stored)")
    args = p.parse_args(argv)
    request_host_devices(args.mesh)

    import jax

    from skilljax import models, sharding
    from skilljax.sampling import Sampler, SamplingParams

    prompts = []
    for n, line in enumerate(Path(args.prompts).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompts.append([int(t) for t in json.loads(line)["token_ids"]])
        except (ValueError, KeyError, TypeError) as e:
            p.error(f"{args.prompts}:{n}: expected {{\"token_ids\": [ints]}} ({e})")
    if not prompts:
        p.error(f"{args.prompts} holds no prompts")
    mesh = sharding.make_mesh(args.mesh) if args.mesh else None
    dtype = models.compute_dtype(args.checkpoint, args.dtype)  # inference: parameters stored so
    cfg, model = models.load(args.checkpoint, mesh, dtype, param_dtype=dtype, layout=args.layout)
    sampler = Sampler(model, pad_id=cfg.pad_token_id or 0, max_top_k=max(64, args.top_k))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k,
                            stop_token_ids=stop_ids(args.checkpoint, cfg))
    key = jax.random.key(args.seed)
    walls, timings, first = [], [], None
    for r in range(args.repeat):
        t0 = time.perf_counter()
        out = sampler.generate(prompts, params, key if r == 0 else jax.random.fold_in(key, r))
        walls.append(time.perf_counter() - t0)
        timings.append(sampler.last_timing)
        first = first or out
    with open(args.out, "w") as f:
        for ids, logp in zip(first.token_ids, first.logprobs):
            f.write(json.dumps({"token_ids": ids, "logprobs": [float(x) for x in logp]}) + "\n")

    warm = timings[1:] or timings
    rate = lambda k, s: sum(t[k] for t in warm) / max(sum(t[s] for t in warm), 1e-9)
    print(json.dumps({
        "decode_tokens_per_s": rate("decode_tokens", "decode_s"),
        "prefill_tokens_per_s": rate("prefill_tokens", "prefill_s"),
        "compile_s": walls[0] - statistics.median(walls[1:]) if len(walls) > 1 else None,
    }))


if __name__ == "__main__":
    main()
