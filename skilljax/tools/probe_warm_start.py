"""Warm-start probe: the SFT phase alone, with its held-out NLL split by kind of expert action.

    python -m skilljax.tools.probe_warm_start --config configs/default.py --workdir /tmp/probe \
        [--config.sft.steps=2000] [--config.sft.without_skills_fraction=0.0 ...]

Runs the config's warm start (`skilljax.rl.warm_start.run`, the trainer's own; no RL) and at every held-out check
(`sft.check_every` steps) prints the held-out NLL as the sum of each kind's share: kind =
the action's first word and the episode step it was taken at (`use@1`: the first device of a
chores procedure, `use@2`: the second, ...). A warm start that sits on a plateau shows which
lookup it has not learned yet (on chores: copying the first device from the skill text, finding
the device after the last one used, copying the destination). The last stdout line is JSON: the
curve, one row per check.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from skilljax import config as config_lib
from skilljax.experiment import build_run
from skilljax.rl import sft, warm_start


def action_kind(sample) -> str:
    words = sample.action.split()
    return f"{words[0] if words else '?'}@{sample.step}"


def probe(config, workdir) -> list[dict]:
    run = build_run(config, Path(workdir))
    curve, t0 = [], time.time()

    groups: dict[str, list] = collections.defaultdict(list)  # filled at the first check

    def check(step: int, held) -> None:
        if not groups:
            for s in held:
                groups[action_kind(s)].append(s)
        tokens = {k: sum(len(s.response_ids) for s in v) for k, v in groups.items()}
        # Each kind's share of the per-token mean: its mean NLL weighted by its tokens.
        visual = run.rollout_config(evaluation=True).visual
        share = {k: sft.evaluate_nll(run.model, v, run.tok.pad_id, visual=visual) * tokens[k]
                 / sum(tokens.values()) for k, v in sorted(groups.items())}
        row = dict(step=step, seconds=round(time.time() - t0, 1),
                   heldout_nll=round(sum(share.values()), 4),
                   share={k: round(v, 4) for k, v in share.items()})
        curve.append(row)
        print(f"step {step} ({row['seconds']:.0f} s): held-out NLL {row['heldout_nll']:.4f} "
              f"= {row['share']}", flush=True)

    try:
        record = warm_start.run(run, lambda s, m: None, on_check=check)
    finally:
        run.close()
    print(f"warm start: {record}", flush=True)
    return curve


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="configs/x.py[:arg]")
    p.add_argument("--workdir", required=True, help="where the tokenizer is written")
    args, overrides = p.parse_known_args(argv)
    curve = probe(config_lib.load_config(args.config, overrides), args.workdir)
    print(json.dumps(dict(curve=curve)))


if __name__ == "__main__":
    main()
