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
    """Installs the line format on the "skilljax" logger (once) and sets the bar mode."""
    if progress not in PROGRESS:
        raise ValueError(f"metrics.progress={progress!r}: use one of {PROGRESS} "
                         "(\"auto\": bars only when stderr is a terminal).")
    _state["progress"] = progress
    if not any(isinstance(h, _Handler) for h in logger.handlers):
        handler = _Handler()
        handler.setFormatter(_Format())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def set_step(step: int | None) -> None:
    """The RL step that following lines name (None: no step)."""
    _state["step"] = step


def info(msg: str, *args) -> None:
    logger.info(msg, *args)


def warning(msg: str, *args) -> None:
    logger.warning(msg, *args)


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
