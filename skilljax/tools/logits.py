"""Logits of one token sequence: `python -m skilljax.tools.logits --checkpoint DIR_OR_PRESET --token-ids 1,2,3`.

Writes float32 logits [T, vocab] to --out (.npy) and prints summary statistics as JSON (last line).
With --mesh (e.g. data=1,fsdp=2,tensor=2) the model is loaded sharded over that mesh.

Qwen2.5-VL checkpoints take `--images a.png[,b.png]`: the token ids already hold each image's
image-pad tokens, expanded as the HF processor writes them (t·h·w / 4 per image, in order); the
images are preprocessed by `skilljax.models.vl_image` (the processor's defaults, or
--min-pixels / --max-pixels) and the sequence gets M-RoPE positions (`qwen_vl.rope_index`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
    p.add_argument("--images", default=None,
                   help="comma-separated image files, in prompt order (Qwen2.5-VL checkpoints)")
    p.add_argument("--min-pixels", type=int, default=None, help="image area bounds of the resize "
                   "(default: the HF processor's)")
    p.add_argument("--max-pixels", type=int, default=None)
    args = p.parse_args(argv)
    request_host_devices(args.mesh)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from skilljax import models, sharding
    from skilljax.models import hf_io, qwen, qwen_vl

    try:
        ids = [int(t) for t in args.token_ids.split(",") if t.strip()]
    except ValueError:
        p.error(f"--token-ids must be comma-separated integers, got {args.token_ids!r}")
    image_files = [f.strip() for f in (args.images or "").split(",") if f.strip()]
    # Checked from config.json before any weight is read.
    is_dir = Path(args.checkpoint).is_dir()
    head = hf_io.read_config(args.checkpoint) if is_dir else None
    is_vl = isinstance(head, qwen_vl.QwenVLConfig)
    if image_files and not is_vl:
        kind = f"a {head.model_type} text checkpoint" if is_dir else "a text preset"
        p.error(f"--images needs a Qwen2.5-VL checkpoint (model_type qwen2_5_vl); "
                f"{args.checkpoint} is {kind}")
    if is_vl:
        pixels, grid, per_image = _images(p, args, head, image_files)
        pads = sum(t == head.image_token_id for t in ids)
        if pads != sum(per_image):
            need = ", ".join(f"{f}: {n}" for f, n in zip(image_files, per_image)) or "no --images"
            p.error(f"--token-ids hold {pads} image-pad tokens (id {head.image_token_id}); the "
                    f"images' grids need {sum(per_image)} ({need})")
    mesh = sharding.make_mesh(args.mesh) if args.mesh else None
    dtype = models.compute_dtype(args.checkpoint, args.dtype)  # inference: parameters stored so
    cfg, model = models.load(args.checkpoint, mesh, dtype, param_dtype=dtype, layout=args.layout,
                             seed=args.seed)
    if not ids or max(ids) >= cfg.vocab_size or min(ids) < 0:
        p.error(f"token ids must lie in [0, {cfg.vocab_size}) and not be empty")
    tokens = jnp.asarray([ids], jnp.int32)
    if is_vl:
        try:
            positions, _, vision = qwen_vl.prepare(cfg, np.asarray([ids]), None, pixels, grid)
        except ValueError as e:  # e.g. an image's pads split by other tokens
            p.error(f"--token-ids do not fit the images: {e}")
        logits = qwen_vl.forward(model, tokens, jnp.ones_like(tokens), positions, vision)[0]
    else:
        logits = qwen.forward(model, tokens, jnp.ones_like(tokens))[0]
    logits = np.asarray(logits, np.float32)
    if args.out:
        np.save(args.out, logits)
    stats = {"shape": list(logits.shape), "mean": float(logits.mean()), "std": float(logits.std()),
             "min": float(logits.min()), "max": float(logits.max()),
             "argmax_last": int(logits[-1].argmax()), "params": cfg.num_params(),
             "devices": len(jax.devices()) if mesh is None else mesh.size,
             "mesh": None if mesh is None else dict(mesh.shape)}
    if is_vl:
        stats["image_grid_thw"] = None if grid is None else grid.tolist()
    print(json.dumps(stats))


def _images(p, args, cfg, files):
    """(pixel_values, grid_thw, image-pad tokens per image) of the --images files; Nones and []
    without images."""
    if not files:
        return None, None, []
    from PIL import Image

    from skilljax.models import qwen_vl
    images = []
    for f in files:
        try:
            with Image.open(f) as image:
                image.load()
                images.append(image)
        except OSError as e:
            p.error(f"--images: cannot read {f}: {e}")
    kw = {k: v for k, v in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels))
          if v is not None}
    return qwen_vl.images_to_inputs(cfg, images, **kw)


if __name__ == "__main__":
    main()
