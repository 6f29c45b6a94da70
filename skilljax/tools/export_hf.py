"""Export a policy as a Hugging Face directory: `python -m skilljax.tools.export_hf --checkpoint SRC --out HF_DIR`.

SRC is an HF directory (re-export, e.g. to change dtype) or a preset name. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)`.
"""

from __future__ import annotations

import argparse
import json


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="HF directory or preset name")
    p.add_argument("--out", required=True, help="output HF directory")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: the model's)")
    p.add_argument("--tokenizer", default=None,
                   help="directory with tokenizer.json to copy (default: the checkpoint's, if any)")
    p.add_argument("--max-shard-gb", type=float, default=4.0)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)

    from pathlib import Path

    from skilljax import models
    from skilljax.models import hf_io

    cfg, model = models.load(args.checkpoint)
    tokenizer = args.tokenizer
    if tokenizer is None and (Path(args.checkpoint) / "tokenizer.json").exists():
        tokenizer = args.checkpoint
    out = hf_io.export(model, args.out, dtype=args.dtype, tokenizer_dir=tokenizer,
                       max_shard_bytes=int(args.max_shard_gb * (1 << 30)), overwrite=args.overwrite)
    print(json.dumps({"out": str(out), "model_type": cfg.model_type, "params": cfg.num_params()}))


if __name__ == "__main__":
    main()
