# %% [markdown]
# # Curriculum analysis of a SKILL0 run
# Draws a training workdir's figures: validation success with and without skills, Δ_k per skill
# file at each curriculum update (the SKILL0 paper's Figure 6), active skill files against the
# budget, prompt tokens per step, and the initial/final evaluation. Set `WORKDIR` and run all.

# %%
import json
import os
from pathlib import Path

from skilljax import plots
from skilljax.metrics import read_metrics

WORKDIR = Path(os.environ.get("WORKDIR", "/tmp/skill0_default"))

# %%
for path in plots.write_all(WORKDIR):
    print(path)

# %%
summary = json.loads((WORKDIR / "summary.json").read_text())
for phase, block in summary["eval"].items():
    print(phase, {mode: round(b["success_rate"], 3) for mode, b in block.items()})

# %%
for update in summary["curriculum"]:
    print(update["step"], "budget", update["budget"], "active", update["active"])
    print("   Δ:", {k: round(v, 3) for k, v in update["deltas"].items()})

# %%
rows = read_metrics(WORKDIR)
print(f"{len(rows)} steps; last: success {rows[-1]['success_rate']:.3f}")
