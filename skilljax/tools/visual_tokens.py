"""Prompt tokens of the interaction history as text against as a rendered image, step by step.

    python -m skilljax.tools.visual_tokens --env alfworld --cf 1,2,4 --out DIR [--tokenizer DIR]

plays one expert episode (the first test task of `--env`; ALFWorld games are synthesized offline
when `$ALFWORLD_DATA` is absent) and at every step counts what SKILL0's two context paths put in
the prompt for the history so far (the last `--history-length` steps, 50 for ALFWorld as released):
- text: the `[Observation]: ... [Action]: ...` lines, in tokens of `--tokenizer` (default: the Qwen
  tokenizer files `run.sh` fetches into .cache/; Qwen2.5 and Qwen3 share the byte-level BPE);
- visual, for each factor cf: the same lines rendered at the env's released setting
  (`skilljax.render`), compressed by cf, and resized as Qwen2.5-VL's processor does
  (`skilljax.models.vl_image`): its image-pad tokens plus the vision start / end tokens.
Writes DIR/visual_tokens.json (per step) and DIR/visual_tokens.png; the last stdout line is JSON
with the mean history tokens per step of each path. Nothing is trained: this is the context cost
side of the text / visual comparison, not its success side.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np

from skilljax import render
from skilljax.envs import base
from skilljax.models import vl_image
from skilljax.tokenizer import Tokenizer

DEFAULT_TOKENIZER = Path(__file__).resolve().parents[2] / ".cache" / "qwen3_tokenizer"
VISION_MARKERS = 2  # <|vision_start|> and <|vision_end|> around the image pads


def history_lines(records: list[tuple[str, str]]) -> str:
    """The released ALFWorld memory format, one line per past step."""
    return "\n".join(f"[Observation]: {' '.join(o.split())} [Action]: {' '.join(a.split())}"
                     for o, a in records)


def image_tokens(image) -> int:
    h, w = vl_image.smart_resize(image.height, image.width)
    grid = np.array([[1, h // vl_image.PATCH_SIZE, w // vl_image.PATCH_SIZE]])
    return vl_image.num_image_tokens(grid)[0] + VISION_MARKERS


def episode_records(env_name: str, seed: int = 0, task_options=None) -> list[tuple[str, str]]:
    """(observation before the action, action) of one expert episode on the first test task."""
    cls = base.env_class(env_name)
    task = cls.make_tasks("test", 1, seed=seed, **(task_options or {}))[0]
    env = cls()
    try:
        obs, _ = env.reset(task, seed=seed)
        records = []
        for _ in range(env.max_steps):
            action = env.expert_action()
            result = env.step(action)
            records.append((obs, action))
            obs = result.observation
            if result.done:
                break
    finally:
        getattr(env, "close", lambda: None)()
    return records


def measure(records, tok: Tokenizer, renderer: render.HistoryRenderer, factors,
            history_length: int) -> list[dict]:
    rows = []
    for step in range(len(records) + 1):  # the prompt of step `step` shows the steps before it
        shown = records[max(0, step - history_length):step]
        text = history_lines(shown)
        row = {"step": step + 1, "text": len(tok.encode(text + "\n")) if shown else 0}
        for cf in factors:
            image = renderer.image(text, cf)
            row[f"cf{cf:g}"] = image_tokens(image)
            row[f"cf{cf:g}_px"] = [image.width, image.height]
        rows.append(row)
    return rows


def figure(rows: list[dict], factors, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["text"] for r in rows], "k-", label="text history")
    for cf in factors:
        ax.plot(steps, [r[f"cf{cf:g}"] for r in rows], "--", label=f"rendered image, cf = {cf:g}")
    ax.set(xlabel="step of the episode", ylabel="history tokens in the prompt", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    path.write_bytes(buf.getvalue())
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--env", default="alfworld", help="an env name or module:Class")
    p.add_argument("--cf", default="1,2,4", help="compression factors, comma-separated")
    p.add_argument("--history-length", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER),
                   help="a directory with tokenizer.json")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args(argv)
    factors = [float(x) for x in args.cf.split(",")]
    if not Path(args.tokenizer, "tokenizer.json").exists():
        p.error(f"--tokenizer {args.tokenizer}: no tokenizer.json there (`bash run.sh setup test` "
                "fetches the Qwen files into .cache/qwen3_tokenizer; or pass a checkpoint's "
                "directory).")
    tok = Tokenizer.load(args.tokenizer)
    records = episode_records(args.env, args.seed)
    rows = measure(records, tok, render.HistoryRenderer.for_env(args.env), factors,
                   args.history_length)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "visual_tokens.json").write_text(json.dumps(
        {"env": args.env, "seed": args.seed, "steps": rows}, indent=1) + "\n")
    figure(rows, factors, out / "visual_tokens.png",
           f"{args.env}, one expert episode ({len(records)} steps)")
    mean = lambda k: round(float(np.mean([r[k] for r in rows])), 1)
    print(json.dumps({"env": args.env, "episode_steps": len(records),
                      "mean_history_tokens": {"text": mean("text"),
                                              **{f"cf{cf:g}": mean(f"cf{cf:g}") for cf in factors}},
                      "final_step": rows[-1]}))


if __name__ == "__main__":
    main()
