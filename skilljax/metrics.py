"""One metrics writer for JSON lines, TensorBoard and (if installed and asked for) Weights & Biases.

`DIR/metrics.jsonl` gets one JSON object per step (`{"step": n, ...}`), flushed at once so a
crash loses nothing already written. On resume, lines for steps at or after the resumed step are
dropped first, so the file never holds two histories. `DIR` is an `etils.epath` path: local, or
`gs://...` (object stores cannot append, so there the file is rewritten whole at every step).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Mapping
from typing import Any

from etils import epath


def _scalar(v: Any) -> float | int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if isinstance(v, (bool, int)) else f


def _row(line: str) -> dict | None:
    """A metrics line, or None for an empty one or one a killed process left half-written."""
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


class MetricsWriter:
    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True,
                 wandb_project: str | None = None, wandb_mode: str | None = None,
                 config: Mapping | None = None, resume_step: int | None = None):
        self.workdir = epath.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / "metrics.jsonl"
        self._lines: list[str] = []
        if self.path.exists():
            self._lines = [line for line in self.path.read_text().splitlines()
                           if (row := _row(line)) is not None
                           and (resume_step is None or row.get("step", -1) < resume_step)]
            if resume_step is not None:
                tmp = self.path.parent / (self.path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in self._lines))
                tmp.replace(self.path)
        self._local = is_local(self.path)
        self._file = self.path.open("a") if self._local else None
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(str(self.workdir / "tensorboard"))
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("wandb_project is set but wandb is not installed: "
                                  "`pip install wandb`, or leave wandb_project empty.") from e
            # One W&B run per workdir: its id is kept there, so a resumed run logs on.
            id_path = self.workdir / "wandb_run_id"
            run_id = id_path.read_text().strip() if id_path.exists() else secrets.token_hex(4)
            id_path.write_text(run_id)
            self._wandb = wandb.init(project=wandb_project, config=dict(config or {}),
                                     dir=str(self.workdir) if self._local else None,
                                     name=self.workdir.name, id=run_id, resume="allow",
                                     mode=wandb_mode or None)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Scalars go everywhere; non-scalar values (lists, dicts, strings) only to the JSON line."""
        record = {"step": int(step)}
        for k, v in metrics.items():
            s = _scalar(v)
            record[k] = v if s is None else (s if math.isfinite(s) else str(s))
            if s is not None and math.isfinite(s):
                if self._tb is not None:
                    self._tb.add_scalar(k, s, step)
        line = json.dumps(record, default=str)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        else:  # no appending on object stores: the whole file again
            self._lines.append(line)
            self.path.write_text("".join(x + "\n" for x in self._lines))
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k != "step"}, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def is_local(path) -> bool:
    """True for a path on this machine's file system (not gs://, s3://, ...)."""
    return "://" not in os.fspath(path)


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
    path = epath.Path(workdir) / "metrics.jsonl"
    return [row for line in path.read_text().splitlines() if (row := _row(line)) is not None]


class NullMetrics:
    """What processes other than the first write: nothing."""

    def write(self, step, metrics) -> None:
        pass

    def close(self) -> None:
        pass
