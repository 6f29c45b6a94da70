"""Export a policy as a Hugging Face directory.

    python -m skilljax.tools.export_hf --checkpoint SRC --out HF_DIR
    python -m skilljax.tools.export_hf --workdir RUN_DIR [--step N] --out HF_DIR

SRC is an HF directory (re-export, e.g. to change dtype) or a preset name; RUN_DIR is a training
workdir of `skilljax.train` (its config.json, its latest checkpoint or `--step`, its tokenizer;
`--config CONFIG[:arg]` for a run older than config.json). The result
loads with `transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)`.
"""

from __future__ import annotations

import argparse
import json


def _from_workdir(config: str | None, overrides: list[str], workdir, step):
    from skilljax import config as config_lib
    from skilljax.experiment import build_model
    from skilljax.rl.checkpoint import Checkpointer
    from skilljax.tokenizer import Tokenizer

    c = (config_lib.load_config(config, overrides) if config
         else config_lib.workdir_config(workdir, overrides))
    tok_dir = workdir / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        raise SystemExit(f"{workdir} has no tokenizer/: is it a skilljax.train workdir?")
    model = build_model(c, Tokenizer.load(tok_dir))
    ckpt = Checkpointer(workdir / "checkpoints")
    ckpt.restore(model, None, step)  # params only; errors name the workdir and the step
    ckpt.close()
    return model, str(tok_dir)


def main(argv=None):
    from skilljax import config as config_lib
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=config_lib.cli_help(workdir_tool=True))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="HF directory or preset name")
    src.add_argument("--workdir", help="a skilljax.train workdir")
    p.add_argument("--config", help="with --workdir: the run's config file[:arg] (default: the "
                   "workdir's config.json)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--out", required=True, help="output HF directory")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: the model's)")
    p.add_argument("--tokenizer", default=None,
                   help="directory with tokenizer.json to copy (default: the checkpoint's, if any)")
    p.add_argument("--max-shard-gb", type=float, default=4.0)
    p.add_argument("--overwrite", action="store_true")
    args, overrides = p.parse_known_args(argv)  # --config.a.b=v: the run's overrides
    if overrides and not args.workdir:
        p.error(f"unrecognized arguments: {' '.join(overrides)}")

    from pathlib import Path

    from skilljax import models
    from skilljax.models import hf_io

    if args.workdir:
        model, tokenizer = _from_workdir(args.config, overrides, Path(args.workdir), args.step)
        cfg = model.cfg
    else:
        cfg, model = models.load(args.checkpoint)
        tokenizer = args.tokenizer
        if tokenizer is None and (Path(args.checkpoint) / "tokenizer.json").exists():
            tokenizer = args.checkpoint
    out = hf_io.export(model, args.out, dtype=args.dtype, tokenizer_dir=tokenizer,
                       max_shard_bytes=int(args.max_shard_gb * (1 << 30)), overwrite=args.overwrite)
    print(json.dumps({"out": str(out), "model_type": cfg.model_type, "params": cfg.num_params()}))


if __name__ == "__main__":
    main()
