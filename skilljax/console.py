"""What a run prints: log lines with time, process and step, and progress bars with an ETA.

Every line goes through the `logging` logger "skilljax" (modules log to its children, e.g.
"skilljax.skills.evolver") and reads

    I1207 15:42:03.512 p0 step 12] success 0.375 invalid 0.031 ...

(level, month and day, local time, process index, the current RL step once the RL loop runs).
Lines go to stdout. Progress bars (tqdm, on stderr) cover the warm start, the RL steps and each
evaluation; lines are written above them. `metrics.progress` chooses: "auto" draws bars when
stderr is a terminal (not in log files or CI), "on" always, "off" never; only the first process
of a multi-process run draws them.
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

logger = logging.getLogger("skilljax")
PROGRESS = ("auto", "on", "off")
_state: dict = {"step": None, "progress": "auto"}


class _Format(logging.Formatter):

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        where = f"p{_process()}" + (f" step {_state['step']}" if _state["step"] is not None else "")
        text = f"{record.levelname[0]}{stamp}.{int(record.msecs):03d} {where}] {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _Handler(logging.Handler):
    """Writes to the current sys.stdout (so captured output sees it) above any open bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stdout)
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - logging must never take the run down
            self.handleError(record)


def setup(progress: str = "auto") -> None:
    """Installs the line format on the "skilljax" logger (once), which then writes its lines
    alone (not also through the root logger's handlers), and sets the bar mode."""
    if progress not in PROGRESS:
        raise ValueError(f"metrics.progress={progress!r}: use one of {PROGRESS} "
                         "(\"auto\": bars only when stderr is a terminal).")
    _state["progress"] = progress
    if not any(isinstance(h, _Handler) for h in logger.handlers):
        handler = _Handler()
        handler.setFormatter(_Format())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    # The entry points own the process's output: a root handler (absl installs one on the first
    # message a dependency logs, e.g. orbax at import) would print every line a second time.
    logger.propagate = False


def set_step(step: int | None) -> None:
    """The RL step that following lines name (None: no step)."""
    _state["step"] = step


def info(msg: str, *args) -> None:
    logger.info(msg, *args)


def warning(msg: str, *args) -> None:
    logger.warning(msg, *args)


def step_line(step: int, steps: int, m: dict, active: int) -> str:
    """The trainer's line for one RL step, from its metrics (validation, SkillForge's bank and
    SAGE's chains where the step has them)."""
    line = (f"step {step}/{steps}: success {m['success_rate']:.3f} invalid {m['invalid_rate']:.3f}"
            f" skills {active} episodes {m['episodes_local']}/{m['episodes']} "
            f"({m['step_s']:.1f}s)" + val_line(m))
    if "bank_size" in m:
        line += f" bank {m['bank_size']} calls/episode {m['skill_calls']:.2f}"
    if "sgc" in m:
        line += (f" sgc {m['sgc']:.3f} library {m['library_size']:.2f} skill use "
                 f"{m['skill_use_rate']:.2f}")
    return line


def val_line(m: dict) -> str:
    """Validation success of a curriculum update: without skills, with the active files, all."""
    if "val_without_skills" not in m:
        return ""
    parts = [f" val without {m['val_without_skills']:.2f}"]
    if "val_with_skills" in m:
        parts.append(f"active {m['val_with_skills']:.2f}")
    if "val_full_skills" in m:
        parts.append(f"all files {m['val_full_skills']:.2f}")
    return " ".join(parts)


def eval_line(phase: str, block: dict) -> str:
    """An evaluation's success (and SGC for scenarios) and prompt tokens, with and without skills."""
    w, wo = block["with_skills"], block["without_skills"]
    sgc = lambda b: (f", SGC {b['scenario_success_rate']:.3f}" if "scenario_success_rate" in b
                     else "")
    return (f"eval {phase}: with skills {w['success_rate']:.3f}{sgc(w)} "
            f"({w['tokens_per_step']:.0f} tok/step), without {wo['success_rate']:.3f}{sgc(wo)} "
            f"({wo['tokens_per_step']:.0f} tok/step)")


def bar(total: int, desc: str, *, initial: int = 0, unit: str = "step") -> tqdm:
    """A progress bar (a disabled one when bars are off); use as a context manager."""
    on = _state["progress"] == "on" or (_state["progress"] == "auto" and sys.stderr.isatty())
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                disable=not (on and _process() == 0), dynamic_ncols=True, leave=False)


def _process() -> int:
    # A multi-process run is initialised (`distributed.initialize_from_env`) before anything
    # logs; in a single process JAX is not asked (asking would start its backend).
    from skilljax import distributed
    return distributed.index() if distributed.active() else 0
