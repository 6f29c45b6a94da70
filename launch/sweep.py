"""Run a config's sweep: every run of its `sweep(add, arg)`, sequentially here, or print commands.

    python launch/sweep.py configs/default.py [--arg runlocal] --workdir /tmp/sweep [--print]
        [--summary] [--only REGEX]

Each run trains in WORKDIR/<run name> (its config argument, made path-safe), so re-running the
sweep resumes unfinished runs and skips finished ones (those with a summary.json). `--print` only
prints one `python -m skilljax.train ...` command per run (to hand to a cluster scheduler).
Runs share warm starts through WORKDIR/warm_start_cache (`sft.cache_dir`): the arms of one seed
differ only after the warm start, so it is trained once per seed.
`--summary` prints a table of the finished runs' final evaluation (without / with skills success)
and draws them in `sweep.png` (next to the `--results` files, else in DIR),
and, when the runs carry seeds, one row per arm with each seed's success and the means over seeds.
`--results DIR` keeps each finished run's evaluation (a small JSON per run, without the model) in
DIR: a run found there counts as finished, and `--summary` reads it, so results gathered over
several sessions or machines (and committed, e.g. results/<sweep>/) make one table.
`--only REGEX` keeps the runs whose name matches (e.g. `seed=1`): two sweep processes over
disjoint runs can share a machine or split a sweep across machines without training a run twice.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path


def _module(config_path: str):
    spec = importlib.util.spec_from_file_location(Path(config_path).stem, config_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs_of(config_path: str, arg: str | None) -> list[dict]:
    module = _module(config_path)
    if not hasattr(module, "sweep"):
        raise SystemExit(f"{config_path} defines no sweep(add, arg).")
    runs: list[dict] = []
    module.sweep(lambda **kw: runs.append(kw), arg)
    return runs


def run_name(run: dict) -> str:
    text = ",".join(f"{k}={v}" for k, v in sorted(run.items()) if k != "arg")
    text = ",".join(filter(None, [run.get("arg", ""), text]))
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", text) or "default"


def shares_warm_start(module, base_arg: str | None, run: dict) -> bool:
    """Whether the run's config has `sft.cache_dir` (unset), so arms can share warm starts."""
    arg = ",".join(filter(None, [base_arg, run.get("arg", "")]))
    config = module.get_config(arg or None)
    return "sft" in config and "cache_dir" in config.sft and not config.sft.cache_dir \
        and "sft.cache_dir" not in run


def command(config_path: str, base_arg: str | None, run: dict, workdir: Path,
            warm_start_cache: Path | None = None) -> list[str]:
    arg = ",".join(filter(None, [base_arg, run.get("arg", "")]))
    cmd = [sys.executable, "-m", "skilljax.train", "--config",
           f"{config_path}:{arg}" if arg else config_path, "--workdir", str(workdir)]
    cmd += [f"--config.{k}={v}" for k, v in sorted(run.items()) if k != "arg"]
    if warm_start_cache is not None:
        cmd.append(f"--config.sft.cache_dir={warm_start_cache}")
    return cmd


def result_record(summary: dict) -> dict:
    """What a sweep table needs from a run's summary.json (its evaluation, curriculum, cost)."""
    return {k: summary[k] for k in ("steps", "wall_s", "timing_s", "warm_start", "eval", "curriculum")
            if k in summary}


def load_result(root: Path, results: Path | None, name: str) -> dict | None:
    for path in ([results / f"{name}.json"] if results else []) + [root / name / "summary.json"]:
        if path.exists():
            return json.loads(path.read_text())
    return None


def save_result(root: Path, results: Path, name: str) -> None:
    summary = json.loads((root / name / "summary.json").read_text())
    results.mkdir(parents=True, exist_ok=True)
    tmp = results / f"{name}.json.tmp"
    tmp.write_text(json.dumps(result_record(summary), indent=1) + "\n")
    tmp.replace(results / f"{name}.json")


def final_behaviour(record: dict) -> dict:
    """The final evaluation without skills; its `success_steps` (logged as 0 when nothing was won)
    dropped when no episode succeeded, so a table shows "–" and a mean over seeds skips it."""
    final = dict(record["eval"]["final"]["without_skills"])
    if not final.get("success_rate"):
        final.pop("success_steps", None)
    return final


def _change(ev: dict, mode: str) -> str:
    """'0.250 → 0.750': held-out success before and after training, in `mode` (with/without skills)."""
    return f"{ev['initial'][mode]['success_rate']:.3f} → {ev['final'][mode]['success_rate']:.3f}"


def summary_table(root: Path, names: list[str], results: Path | None = None) -> str:
    """Initial → final held-out success without and with skills, and the final policy's behaviour
    without skills (ReuseRL's signals: successful-episode length, rejected and repeated actions)."""
    lines = ["| run | without skills (initial → final) | with skills (initial → final) | "
             "successful-episode steps | rejected actions | repeated actions |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in names:
        record = load_result(root, results, name)
        if record is None:
            lines.append(f"| {name} | (not finished) | | | | |")
            continue
        ev = record["eval"]
        final = final_behaviour(record)
        extra = " | ".join(f"{final[k]:.3f}" if k in final else "–"
                           for k in ("success_steps", "rejected_rate", "repeat_rate"))
        lines.append(f"| {name} | {_change(ev, 'without_skills')} | {_change(ev, 'with_skills')} | "
                     f"{extra} |")
    return "\n".join(lines)


def _seed_of(name: str) -> tuple[str, str | None]:
    """('variant=grpo', '1') for 'variant=grpo,seed=1'; (name, None) when the name has no seed."""
    parts = name.split(",")
    seeds = [p.split("=", 1)[1] for p in parts if p.startswith("seed=")]
    arm = ",".join(p for p in parts if not p.startswith("seed=")) or "default"
    return arm, (seeds[0] if seeds else None)


def binomial_se(p: float, n: int) -> float:
    """Standard error of a success rate p measured on n independent episodes."""
    return (p * (1 - p) / n) ** 0.5 if n else float("nan")


def seed_table(root: Path, names: list[str], results: Path | None = None) -> str | None:
    """The runs grouped by arm (the name without its `seed=`): final success without skills per
    seed (initial → final) and their mean ± the binomial standard error of one final evaluation
    (sqrt(p(1 − p)/n) at the mean, n its episodes), and the behaviour columns averaged over the arm's
    finished seeds (successful-episode steps over the seeds that had a success). None when the
    runs have no seeds."""
    arms: dict[str, dict[str, dict | None]] = {}
    for name in names:
        arm, seed = _seed_of(name)
        if seed is None:
            return None
        arms.setdefault(arm, {})[seed] = load_result(root, results, name)
    seeds = sorted({s for runs in arms.values() for s in runs}, key=lambda s: (len(s), s))
    lines = ["| arm | " + " | ".join(f"success, seed {s}" for s in seeds)
             + " | mean final success | successful-episode steps | rejected actions | "
               "repeated actions |",
             "| --- |" + " --- |" * (len(seeds) + 4)]
    for arm, runs in arms.items():
        cells, finals = [], []
        for s in seeds:
            record = runs.get(s)
            if record is None:
                cells.append("(not finished)")
                continue
            cells.append(_change(record["eval"], "without_skills"))
            finals.append(final_behaviour(record))
        mean = lambda k: (f"{sum(f[k] for f in finals if k in f) / n:.3f}"
                          if (n := sum(k in f for f in finals)) else "–")
        success = mean("success_rate")
        if finals:  # the noise of one evaluation of this many episodes, at the mean
            success += f" ± {binomial_se(float(success), min(f['episodes'] for f in finals)):.3f}"
        tail = [success, mean("success_steps"), mean("rejected_rate"), mean("repeat_rate")]
        lines.append(f"| {arm} | " + " | ".join(cells + tail) + " |")
    return "\n".join(lines)


def sweep_plot(config: str, arg: str | None, root: Path, names: list[str],
               results: Path | None) -> Path | None:
    """sweep.png next to the results (the --results folder, else the sweep's workdir): every arm's
    finished seeds (`skilljax.plots.sweep_figure`); None when no run has finished."""
    arms: dict[str, dict[str, dict]] = {}
    for name in names:
        record = load_result(root, results, name)
        if record is not None and "final" in record.get("eval", {}):
            arm, seed = _seed_of(name)
            arms.setdefault(arm.removeprefix("variant="), {})[seed or "0"] = record["eval"]
    if not arms:
        return None
    from skilljax.plots import sweep_figure
    out = (results or root) / "sweep.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_figure(arms, out, Path(config).stem + (f" ({arg})" if arg else ""))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("--arg", default=None, help="argument added to every run's config argument")
    p.add_argument("--workdir", required=True)
    p.add_argument("--print", action="store_true", help="print the commands, run nothing")
    p.add_argument("--summary", action="store_true", help="print the results table, run nothing")
    p.add_argument("--results", default=None,
                   help="folder of per-run result JSONs: finished runs are kept there and skipped")
    p.add_argument("--no-shared-warm-start", action="store_true",
                   help="give every run its own warm start (by default runs whose warm-start "
                        "inputs are equal, e.g. ablation arms of one seed, share one)")
    p.add_argument("--only", default=None, metavar="REGEX",
                   help="keep only the runs whose name matches REGEX (re.search), e.g. 'seed=1'")
    args = p.parse_args(argv)
    root = Path(args.workdir)
    results = Path(args.results) if args.results else None
    runs = runs_of(args.config, args.arg)
    if args.only is not None:
        try:
            pattern = re.compile(args.only)
        except re.error as e:
            raise SystemExit(f"--only {args.only!r} is not a regular expression ({e}).")
        kept = [r for r in runs if pattern.search(run_name(r))]
        if not kept:
            raise SystemExit(f"--only {args.only!r} matches none of the sweep's runs: "
                             + ", ".join(run_name(r) for r in runs))
        runs = kept
    names = [run_name(r) for r in runs]
    if args.summary:
        print(summary_table(root, names, results))
        if (table := seed_table(root, names, results)) is not None:
            print("\nBy arm (means over the finished seeds):\n" + table)
        if (figure := sweep_plot(args.config, args.arg, root, names, results)) is not None:
            print(f"\nfigure: {figure}")
        return
    module = _module(args.config)
    for run, name in zip(runs, names):
        share = not args.no_shared_warm_start and shares_warm_start(module, args.arg, run)
        cmd = command(args.config, args.arg, run, root / name,
                      root / "warm_start_cache" if share else None)
        if args.print:
            print(shlex.join(cmd))
            continue
        if results is not None and (results / f"{name}.json").exists():
            print(f"[sweep] {name}: in {results}, skipped", flush=True)
            continue
        if not (root / name / "summary.json").exists():
            print(f"[sweep] {name}: {shlex.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True)
        else:
            print(f"[sweep] {name}: finished, skipped", flush=True)
        if results is not None:
            save_result(root, results, name)
    if not args.print:
        print(summary_table(root, names, results))


if __name__ == "__main__":
    main()
