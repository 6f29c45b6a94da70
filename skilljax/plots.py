"""PNG figures of a training workdir (matplotlib, no display needed).

`write_all(workdir)` draws, from metrics.jsonl and summary.json:
- success.png: validation success with every skill file, with the active files and without
  skills over steps (and train success);
- deltas.png: Δ_k per skill file at every curriculum update (the SKILL0 paper's Figure 6);
- skills.png: active skill files and the stage budget over steps;
- tokens.png: prompt tokens per step by part (skill, history, observation, template);
- evolution.png (SkillForge runs): bank size (general / task-type skills), skill calls per
  episode, and every skill's EMA success p̂ and underperformance score conf(s) over steps.
"""

from __future__ import annotations

import io
import json
from etils import epath

from skilljax.metrics import read_metrics


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_all(workdir) -> list:
    workdir = epath.Path(workdir)  # local or remote (gs://...)
    rows = read_metrics(workdir) if (workdir / "metrics.jsonl").exists() else []
    out_dir = workdir / "plots"
    out_dir.mkdir(exist_ok=True)
    if not rows:
        return []
    plt = _pyplot()
    written = []

    def save(fig, name):
        path = out_dir / name
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        path.write_bytes(buf.getvalue())
        plt.close(fig)
        written.append(path)

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(steps, [r.get("success_rate", 0) for r in rows], color="0.75", lw=1,
            label="train rollouts (active skills)")
    val = [r for r in rows if "val_without_skills" in r]
    for key, style, label in (("val_full_skills", "^-", "validation, all skill files"),
                              ("val_with_skills", "o-", "validation, active skill files"),
                              ("val_without_skills", "s-", "validation, without skills")):
        pts = [(r["step"], r[key]) for r in val if key in r]  # no active pass at budget 0
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set(xlabel="RL step", ylabel="success rate", ylim=(-0.02, 1.02))
    ax.legend(fontsize=8)
    save(fig, "success.png")

    if val and any(r.get("deltas") for r in val):
        files = sorted({f for r in val for f in r.get("deltas", {})})
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for f in files:
            pts = [(r["step"], r["deltas"][f]) for r in val if f in r.get("deltas", {})]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f)
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xlabel="RL step", ylabel="Δ_k (with − without skills)")
        ax.legend(fontsize=7)
        save(fig, "deltas.png")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.step(steps, [r.get("active_skills", 0) for r in rows], where="post", label="active files")
    ax.step(steps, [r.get("budget", 0) for r in rows], where="post", ls="--", label="budget M(s)")
    ax.set(xlabel="RL step", ylabel="skill files")
    ax.legend(fontsize=8)
    save(fig, "skills.png")

    parts = ("skill", "history", "observation", "template")
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
