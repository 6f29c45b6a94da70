"""PNG figures of a training workdir, and of a sweep (matplotlib, no display needed).

`write_all(workdir)` draws, from metrics.jsonl, summary.json and config.json, each titled with the
run (workdir name) and its seed, with the curriculum's stage boundaries (where the budget M(s)
changes) as dashed lines:
- success.png: validation success with every skill file ("with skills", the full set), with the
  active files and without skills, and the train rollouts' success (raw and smoothed);
- deltas.png: Δ_k per skill file at every curriculum update (the SKILL0 paper's Figure 6); a file
  that was withdrawn at an update is a gap there (its "with" pass had no text of it: no Δ);
- skills.png: active skill files and the stage budget over steps;
- tokens.png: prompt tokens per step by part (skill, history, observation, template);
- evolution.png (SkillForge runs): bank size (general / task-type skills), skill calls per
  episode, and every skill's EMA success p̂ and underperformance score conf(s) over steps;
- eval.png: test success with and without skills, initial and final.
`sweep_figure(arms, path, title)` draws one sweep: per arm, the final success of each seed
(dots) and their mean with the binomial standard error of one evaluation (`launch/sweep.py
--summary` writes it next to the sweep's table); `sweep_records(folder)` reads the arms of a
results folder. `curriculum_table(history)` writes a run's curriculum updates as markdown (for
notebooks).
"""

from __future__ import annotations

import io
import json
import math

from etils import epath

from skilljax.metrics import read_metrics

SMOOTH = 0.1  # EMA weight of the newest step in the smoothed train curve


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _title(workdir) -> str:
    """"RUN, seed N" from the workdir's name and config.json."""
    seed = None
    if (workdir / "config.json").exists():
        try:
            seed = json.loads((workdir / "config.json").read_text()).get("seed")
        except (json.JSONDecodeError, OSError):
            pass
    return workdir.name + ("" if seed is None else f", seed {seed}")


def _stages(rows: list) -> list[tuple[int, int]]:
    """(step, new budget) where the curriculum's budget changes."""
    out, last = [], None
    for r in rows:
        b = r.get("budget")
        if b is not None and last is not None and b != last:
            out.append((r["step"], b))
        if b is not None:
            last = b
    return out


def _mark_stages(ax, stages) -> None:
    for step, budget in stages:
        ax.axvline(step, color="0.5", ls=":", lw=0.8)
        ax.annotate(f"M={budget}", (step, 1), xycoords=("data", "axes fraction"),
                    xytext=(2, -10), textcoords="offset points", fontsize=7, color="0.4")


def delta_series(val_rows: list) -> dict[str, list[tuple[int, float]]]:
    """Per skill file, (step, Δ_k) at each curriculum update; NaN (a gap) where the file was not
    active in that update's with-skills pass (`active_files` of the row), so its Δ measured
    nothing of it."""
    files = sorted({f for r in val_rows for f in r.get("deltas", {})})
    return {f: [(r["step"], r["deltas"][f] if f in r.get("active_files", [f]) else math.nan)
                for r in val_rows if f in r.get("deltas", {})] for f in files}


def smooth(values: list[float], weight: float = SMOOTH) -> list[float]:
    """Exponential moving average (the first value as it is)."""
    out, ema = [], None
    for v in values:
        ema = v if ema is None else (1 - weight) * ema + weight * v
        out.append(ema)
    return out


def write_all(workdir) -> list:
    workdir = epath.Path(workdir)  # local or remote (gs://...)
    rows = read_metrics(workdir) if (workdir / "metrics.jsonl").exists() else []
    out_dir = workdir / "plots"
    out_dir.mkdir(exist_ok=True)
    if not rows:
        return []
    plt = _pyplot()
    written = []
    title = _title(workdir)
    stages = _stages(rows)

    def save(fig, name):
        path = out_dir / name
        for ax in fig.axes:  # the figure's subject goes on top of each figure
            if not ax.get_title():
                ax.set_title(title, fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        path.write_bytes(buf.getvalue())
        plt.close(fig)
        written.append(path)

    steps = [r["step"] for r in rows]
    train = [(r["step"], r["success_rate"]) for r in rows if "success_rate" in r]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if train:
        ax.plot([p[0] for p in train], [p[1] for p in train], color="0.82", lw=1,
                label="train rollouts (active skills)")
        ax.plot([p[0] for p in train], smooth([p[1] for p in train]), color="0.45", lw=1.5,
                label=f"train, smoothed (EMA {SMOOTH:g})")
    val = [r for r in rows if "val_without_skills" in r]
    for key, style, label in (("val_full_skills", "^-", "validation, with skills (all files)"),
                              ("val_with_skills", "o--", "validation, active files only"),
                              ("val_without_skills", "s-", "validation, without skills")):
        pts = [(r["step"], r[key]) for r in val if key in r]  # no active pass at budget 0
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label,
                    alpha=0.6 if key == "val_with_skills" else 1.0)
    _mark_stages(ax, stages)
    ax.set(xlabel="RL step", ylabel="success rate", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    save(fig, "success.png")

    if val and any(r.get("deltas") for r in val):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for f, pts in delta_series(val).items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f)
        ax.axhline(0, color="k", lw=0.5)
        _mark_stages(ax, stages)
        ax.set(xlabel="RL step (updates; a gap: the file was withdrawn)",
               ylabel="Δ_k (with − without skills)")
        ax.legend(fontsize=7)
        save(fig, "deltas.png")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.step(steps, [r.get("active_skills", 0) for r in rows], where="post", label="active files")
    ax.step(steps, [r.get("budget", 0) for r in rows], where="post", ls="--", label="budget M(s)")
    _mark_stages(ax, stages)
    ax.set(xlabel="RL step", ylabel="skill files")
    ax.legend(fontsize=8)
    save(fig, "skills.png")

    parts = ("skill", "history", "observation", "template")
    if any(r.get("tokens_image") for r in rows):  # SKILL0's visual context: image-pad tokens
        parts += ("image",)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.stackplot(steps, *[[r.get(f"tokens_{p}", 0) for r in rows] for p in parts], labels=parts)
    ax.set(xlabel="RL step", ylabel="prompt tokens per env step")
    ax.legend(fontsize=8, loc="upper right")
    save(fig, "tokens.png")

    if any("bank_size" in r for r in rows):
        _evolution(plt, save, [r for r in rows if "bank_size" in r])

    summary = workdir / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        phases = [p for p in ("initial", "final") if p in s.get("eval", {})]
        if phases:
            fig, ax = plt.subplots(figsize=(4.5, 3.2))
            for i, mode in enumerate(("with_skills", "without_skills")):
                vals = [s["eval"][p][mode]["success_rate"] for p in phases]
                ax.bar([j + 0.38 * i for j in range(len(phases))], vals, width=0.36,
                       label=mode.replace("_", " "))
            ax.set_xticks([j + 0.19 for j in range(len(phases))], phases)
            ax.set(ylabel="test success rate", ylim=(0, 1))
            ax.legend(fontsize=8)
            save(fig, "eval.png")
    return written


def _evolution(plt, save, rows: list) -> None:
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    ax = axes[0][0]
    ax.stackplot(steps, [r.get("bank_general", 0) for r in rows],
                 [r.get("bank_specific", 0) for r in rows], labels=("general", "task type"))
    ax.set(xlabel="RL step", ylabel="active skills", title="bank size")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[0][1]
    ax.plot(steps, [r.get("skill_calls", 0) for r in rows], label="calls per episode")
    ax.plot(steps, [r.get("episodes_calling", 0) / max(r.get("episodes", 1), 1) for r in rows],
            label="episodes calling (share)")
    ax.set(xlabel="RL step", title="skill calls")
    ax.legend(fontsize=8)
    ids = sorted({k for r in rows for k in r.get("skill_stats", {})})
    for k, (ax, what) in enumerate(((axes[1][0], "EMA success p̂"), (axes[1][1], "conf(s)"))):
        for sid in ids:
            pts = [(r["step"], r["skill_stats"][sid][k]) for r in rows
                   if sid in r.get("skill_stats", {})]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, label=sid)
        ax.set(xlabel="RL step", title=what, ylim=(-0.02, 1.02))
        if 0 < len(ids) <= 12:
            ax.legend(fontsize=6, ncol=2)
    save(fig, "evolution.png")


def sweep_figure(arms: dict[str, dict[str, dict]], path, title: str) -> None:
    """One figure of a sweep: per arm, each seed's final test success without skills (dots) and
    with skills (crosses), and their means with the binomial standard error of one evaluation at
    the mean (error bars). `arms`: arm → seed → eval block ({"final": {mode: {...}}})."""
    plt = _pyplot()
    names = list(arms)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(names) + 2), 3.6))
    for off, mode, marker, label in ((-0.12, "without_skills", "o", "without skills"),
                                     (0.12, "with_skills", "x", "with skills")):
        means, errs = [], []
        for i, arm in enumerate(names):
            finals = [ev["final"][mode] for ev in arms[arm].values() if ev]
            vals = [f["success_rate"] for f in finals]
            ax.scatter([i + off] * len(vals), vals, marker=marker, s=18, color="0.35", zorder=3)
            m = sum(vals) / len(vals) if vals else math.nan
            n = min((f.get("episodes", 0) for f in finals), default=0)
            means.append(m)
            errs.append(math.sqrt(m * (1 - m) / n) if n and vals else math.nan)
        ax.errorbar([i + off for i in range(len(names))], means, yerr=errs, fmt="_", ms=14,
                    capsize=3, label=f"{label}: mean ± binomial SE", zorder=2)
    seeds = sorted({s for runs in arms.values() for s in runs})
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="final test success", ylim=(-0.02, 1.02),
           title=f"{title} (seeds {', '.join(seeds)})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    epath.Path(path).write_bytes(buf.getvalue())
    plt.close(fig)


def sweep_records(folder) -> dict[str, dict[str, dict]]:
    """A results folder's run records (`launch/sweep.py --results`: one NAME.json per run, NAME
    `k=v,...,seed=N`) as arm (NAME without its seed, `variant=` dropped) → seed → eval block, for
    `sweep_figure`. Records without a final evaluation are left out."""
    arms: dict[str, dict[str, dict]] = {}
    for path in sorted(epath.Path(folder).glob("*=*.json")):
        record = json.loads(path.read_text())
        if "final" not in record.get("eval", {}):
            continue
        parts = path.name.removesuffix(".json").split(",")
        seed = next((p.split("=", 1)[1] for p in parts if p.startswith("seed=")), "0")
        arm = ",".join(p for p in parts if not p.startswith("seed=")) or "default"
        arms.setdefault(arm.removeprefix("variant="), {})[seed] = record["eval"]
    return dict(sorted(arms.items(), key=lambda kv: kv[0]))


def curriculum_table(history: list[dict]) -> str:
    """A run's curriculum updates (the "curriculum" list of summary.json or a run record) as a
    markdown table: step, the budget set by the update, Δ_k per skill file ("–" where the file was
    not active in that update's with-skills pass, or the update had none) and the files kept."""
    files = sorted({f for u in history for f in u.get("deltas", {})}
                   | {f for u in history for f in u.get("active", [])})
    lines = ["| step | budget | " + " | ".join(f"Δ {f}" for f in files) + " | kept |",
             "| --- | --- |" + " --- |" * len(files) + " --- |"]
    measured = set(files)  # the files active during an update's pass: all, before the first
    for u in history:
        deltas = u.get("deltas", {})
        cells = [f"{deltas[f]:+.2f}" if f in deltas and f in measured else "–" for f in files]
        lines.append(f"| {u['step']} | {u['budget']} | " + " | ".join(cells)
                     + f" | {', '.join(u.get('active', [])) or '(none)'} |")
        measured = set(u.get("active", []))
    return "\n".join(lines)
