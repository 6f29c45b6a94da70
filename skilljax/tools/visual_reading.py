"""Does a visual policy read its image? Held-out NLL of expert responses with each episode's own
image against the same prompts shown another episode's image.

    python -m skilljax.tools.visual_reading --workdir DIR [--tasks 60] [--seed 7] [--step N]

DIR: a `skilljax.train` workdir of a visual run (`visual.enabled`; e.g. `configs/default.py:visual`
with `--config.visual.skills_in_image=true`). Expert episodes of warm-start-style tasks (each
randomised procedure shown with its own text, as the warm start shows it) are played with the
run's prompts; the response NLL of the checkpoint's policy is measured twice: with the images the
prompts were built with, and with each sample's image swapped for that of the same step of another
episode (a cyclic shift over episodes; image sizes may differ, so each prompt's image-pad run is
rebuilt for its new image). A policy that reads the image does worse with the swapped ones; one
that ignores it scores the same. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax

from skilljax import config as config_lib
from skilljax.envs import base as envs_base
from skilljax.experiment import build_run
from skilljax.rl import sft, warm_start
from skilljax.rl.checkpoint import Checkpointer
from skilljax.rl.rollout import rollout
from skilljax.rl.visual import vision_ids


def swap_images(samples, tok, visual) -> list:
    """The samples with each one's image taken from the same step of the next episode that has
    one (image-pad runs rebuilt for the new image's size)."""
    start, pad, end = vision_ids(tok)
    by_step: dict[int, list] = {}
    for s in samples:
        by_step.setdefault(s.step, []).append(s)
    out = []
    renderer = visual.renderer()
    for group in by_step.values():
        for k, s in enumerate(group):
            other = group[(k + 1) % len(group)].image
            pads = visual.inputs(renderer.image(*other))[2]
            a, b = s.prompt_ids.index(start), s.prompt_ids.index(end)
            ids = s.prompt_ids[:a] + [start] + [pad] * pads + s.prompt_ids[b:]
            out.append(dataclasses.replace(s, prompt_ids=ids, image=other))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--tasks", type=int, default=60)
    p.add_argument("--seed", type=int, default=7, help="task generator seed (not the run's)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    args = p.parse_args(argv)
    c = config_lib.workdir_config(args.workdir)
    run = build_run(c, args.workdir, train_tokenizer=False)
    try:
        visual = run.rollout_config(evaluation=True).visual
        if visual is None:
            raise SystemExit(f"{args.workdir} is not a visual run (visual.enabled is false).")
        ckpt = Checkpointer(run.workdir / "checkpoints")
        step, _, _ = ckpt.restore(run.model, None, args.step)
        ckpt.close()
        tasks = envs_base.env_class(c.env.name).make_tasks(
            "train", args.tasks, seed=args.seed, **dict(c.sft.task_options))
        cfg = dataclasses.replace(run.rollout_config(evaluation=True), group_size=1)
        res = rollout(None, run.tok, run.pool, tasks, cfg, jax.random.key(0), fmt=run.fmt,
                      expert=True, skill_context=lambda t: warm_start.warmup_context(run.bank, t))
        own = sft.evaluate_nll(run.model, res.samples, run.tok.pad_id, visual=visual)
        swapped = sft.evaluate_nll(run.model, swap_images(res.samples, run.tok, visual),
                                   run.tok.pad_id, visual=visual)
    finally:
        run.close()
    print(f"checkpoint {step}: response NLL with each episode's own image {own:.4f}, with "
          f"another episode's {swapped:.4f} ({len(res.samples)} step samples, "
          f"{args.tasks} tasks)")
    print(json.dumps({"step": step, "samples": len(res.samples), "nll_own": own,
                      "nll_swapped": swapped, "skills_in_image": visual.skills_in_image}))


if __name__ == "__main__":
    main()
