"""Logits of one token sequence: `python -m skilljax.tools.logits --checkpoint DIR_OR_PRESET --token-ids 1,2,3`.

Writes float32 logits [T, vocab] to --out (.npy) and prints summary statistics as JSON (last line).
With --mesh (e.g. data=1,fsdp=2,tensor=2) the model is loaded sharded over that mesh.
"""

from __future__ import annotations

import argparse
import json

from skilljax.tools import request_host_devices


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="HF directory or preset name (e.g. tiny)")
    p.add_argument("--token-ids", required=True, help="comma-separated token ids")
    p.add_argument("--mesh", default=None, help="e.g. data=1,fsdp=2,tensor=2")
    p.add_argument("--layout", default="fsdp_tp", help="fsdp | tp | fsdp_tp")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: as stored)")
    p.add_argument("--seed", type=int, default=0, help="init seed for presets")
    p.add_argument("--out", default=None, help="output .npy file")
    args = p.parse_args(argv)
    request_host_devices(args.mesh)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from skilljax import models, sharding
    from skilljax.models import qwen

    try:
        ids = [int(t) for t in args.token_ids.split(",") if t.strip()]
    except ValueError:
        p.error(f"--token-ids must be comma-separated integers, got {args.token_ids!r}")
    mesh = sharding.make_mesh(args.mesh) if args.mesh else None
    dtype = models.compute_dtype(args.checkpoint, args.dtype)  # inference: parameters stored so
    cfg, model = models.load(args.checkpoint, mesh, dtype, param_dtype=dtype, layout=args.layout,
                             seed=args.seed)
    if not ids or max(ids) >= cfg.vocab_size or min(ids) < 0:
        p.error(f"token ids must lie in [0, {cfg.vocab_size}) and not be empty")
    tokens = jnp.asarray([ids], jnp.int32)
    logits = np.asarray(qwen.forward(model, tokens, jnp.ones_like(tokens))[0], np.float32)
    if args.out:
        np.save(args.out, logits)
    stats = {"shape": list(logits.shape), "mean": float(logits.mean()), "std": float(logits.std()),
             "min": float(logits.min()), "max": float(logits.max()),
             "argmax_last": int(logits[-1].argmax()), "params": cfg.num_params(),
             "devices": len(jax.devices()) if mesh is None else mesh.size,
             "mesh": None if mesh is None else dict(mesh.shape)}
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
