"""EnvPool: environments of one kind in worker processes, stepped in batches.

Episode i lives in worker i % num_workers for as long as it runs. A batch call (`reset`, `step`,
`expert_actions`) sends every worker its share at once and gathers the answers, so W workers step
W environments at a time. Workers are separate interpreters (`python -m skilljax.envs.worker`),
optionally another Python (`python=`), for games whose dependencies clash with the JAX stack.

Failures never stop the run. An exception inside an env fails that episode (reason recorded). A
worker that crashes, or gives no answer for `timeout_s` on one item, is killed and restarted: the
episode it was serving fails with the reason, and so do the other episodes whose state died with
it (interrupted resets are retried on the new worker). A failed episode reads as done, not won,
with `info["failure"]` saying why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from skilljax.envs.base import EnvError, StepResult, Task, env_target

_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])


@dataclasses.dataclass
class ResetResult:
    observation: str
    info: dict[str, Any]
    failure: str | None = None


class _Died(Exception):
    pass


class _Worker:
    def __init__(self, index: int, python: str, env: str, env_kwargs: dict, log_dir: str):
        self.index = index
        self.log_path = os.path.join(log_dir, f"worker{index}.log")
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT] + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [python, "-m", "skilljax.envs.worker", env, json.dumps(env_kwargs)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=environ,
                start_new_session=True)  # a Ctrl-C in the terminal reaches the host only
        self._buf = b""

    def send(self, obj) -> None:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _Died(self.death_reason()) from e

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def next_line(self) -> dict | None:
        """A buffered answer, if a whole line has arrived."""
        if b"\n" not in self._buf:
            return None
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def fill(self) -> None:
        """Reads what the pipe holds (call when select says readable); `_Died` on EOF."""
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            raise _Died(self.death_reason())
        self._buf += chunk

    def recv(self, timeout_s: float) -> dict:
        """The next answer line; `_Died` on EOF, `TimeoutError` after `timeout_s` of silence."""
        deadline = time.monotonic() + timeout_s
        while (msg := self.next_line()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if select.select([self.fileno()], [], [], left)[0]:
                self.fill()
        return msg

    def death_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        return f"env worker {self.index} (pid {self.proc.pid}) died (exit code {code})"

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(pathlib.Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _kill_all(workers):
    for w in workers:
        w.kill()


class EnvPool:
    def __init__(self, env: str, num_workers: int = 2, env_kwargs: Mapping[str, Any] | None = None,
                 timeout_s: float = 60.0, start_timeout_s: float = 120.0, python: str | None = None,
                 log_dir: str | None = None, sidecars: Sequence[Any] = ()):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
        # Processes the workers depend on (`Env.start_sidecars`): checked (and restarted when
        # they died) before every reset, closed with the pool.
        self.sidecars = list(sidecars)
        self.sidecar_events: list[str] = []
        self.env = env
        self.num_workers = num_workers
        self.env_kwargs = dict(env_kwargs or {})
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.python = python or sys.executable
        # Workers' stderr; a directory made here is removed by a close() after no worker died.
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix=f"skilljax_{env}_workers_")
        self.restarts = 0
        self._lost: dict[int, str] = {}  # episode → why it failed outside any call of its own
        self._episodes_of: list[set[int]] = [set() for _ in range(num_workers)]
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        for i in range(num_workers):
            self._workers.append(self._spawn(i, wait=False))
        for w in self._workers:
            self._await_ready(w)

    # ---------------------------------------------------------------- lifecycle

    def _spawn(self, index: int, wait: bool = True) -> _Worker:
        w = _Worker(index, self.python, env_target(self.env), self.env_kwargs, self.log_dir)
        if wait:
            self._await_ready(w)
        return w

    def _await_ready(self, w: _Worker) -> None:
        try:
            msg = w.recv(self.start_timeout_s)
        except (_Died, TimeoutError) as e:
            w.kill()
            self.close()
            raise EnvError(
                f"The {self.env!r} env worker did not start ({e or 'timed out'}) with {self.python}. "
                f"Its log ({w.log_path}) ends with:\n{w.log_tail()}\n"
                "Check that the environment's dependencies are installed for that interpreter.") from None
        assert msg.get("ready"), msg

    def _restart(self, index: int, reason: str) -> None:
        self._workers[index].kill()
        for eid in self._episodes_of[index]:
            self._lost.setdefault(eid, reason)
        self._episodes_of[index] = set()
        self._workers[index] = self._spawn(index)
        self.restarts += 1

    def close(self) -> None:
        for sidecar in self.sidecars:
            sidecar.close()
        for w in self._workers:
            try:
                w.send({"cmd": "shutdown"})
                w.proc.wait(timeout=5)
            except (_Died, subprocess.TimeoutExpired, ValueError, OSError):
                pass
        _kill_all(self._workers)
        self._workers.clear()
        if self._own_log_dir and not self.restarts:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- batched calls

    def _call(self, cmd: str, items: Sequence[list]) -> dict[int, dict]:
        """Runs `cmd` on every item (item[0] = episode) in its worker; answers by episode.

        Items of a worker that died get {"failure": reason}; that worker is restarted.
        """
        by_worker: dict[int, list[list]] = {}
        for item in items:
            by_worker.setdefault(item[0] % self.num_workers, []).append(item)
        answers: dict[int, dict] = {}
        pending: dict[int, list[list]] = {}
        for wi, its in by_worker.items():
            try:
                self._workers[wi].send({"cmd": cmd, "items": its})
                pending[wi] = list(its)
            except _Died as e:
                self._fail_worker(wi, its, str(e), cmd, answers)
        # Gather: each worker streams one line per item; it is dead when it hangs up, or hung
        # when it stays silent on one item for timeout_s.
        deadline = {wi: time.monotonic() + self.timeout_s for wi in pending}
        while pending:
            for wi in list(pending):
                its, w = pending[wi], self._workers[wi]
                try:
                    while (msg := w.next_line()) is not None:
                        if msg.get("done"):
                            del pending[wi]
                            break
                        its.pop(0)
                        answers[msg["episode"]] = msg
                        deadline[wi] = time.monotonic() + self.timeout_s
                except Exception as e:  # noqa: BLE001  (garbled protocol line: treat as a crash)
                    self._fail_worker(wi, its, f"worker {wi} sent a bad answer ({e}) during {cmd}",
                                      cmd, answers)
                    del pending[wi]
            if not pending:
                break
            wait = max(0.0, min(deadline[wi] for wi in pending) - time.monotonic())
            readable = select.select([self._workers[wi].fileno() for wi in pending], [], [], wait)[0]
            for wi in list(pending):
                its = pending[wi]
                if self._workers[wi].fileno() in readable:
                    try:
                        self._workers[wi].fill()
                    except _Died as e:
                        self._fail_worker(wi, its, f"{e} during {cmd}{_of(its)}; restarted",
                                          cmd, answers)
                        del pending[wi]
                elif time.monotonic() >= deadline[wi]:
                    self._fail_worker(wi, its, f"no answer within {self.timeout_s:g} s to {cmd}"
                                      f"{_of(its)} (hung); worker restarted", cmd, answers)
                    del pending[wi]
        return answers

    def _fail_worker(self, wi, unanswered, reason, cmd, answers) -> None:
        culprit = unanswered[0][0] if unanswered else None
        if unanswered:
            answers[culprit] = {"failure": reason}
        self._restart(wi, reason)
        rest = unanswered[1:]
        if cmd == "reset" and rest:  # nothing was lost yet: start those episodes on the new worker
            self._episodes_of[wi].update(item[0] for item in rest)
            for item in rest:
                self._lost.pop(item[0], None)
            answers.update(self._call("reset", rest))
        else:
            for item in rest:
                answers[item[0]] = {"failure": f"lost when worker {wi} was restarted "
                                               f"(episode {culprit}: {reason})"}

    # ---------------------------------------------------------------- public API

    def reset(self, tasks: Sequence[Task], seeds: Sequence[int]) -> list[ResetResult]:
        """Starts episodes 0..len(tasks)-1 (replacing any previous ones)."""
        if len(tasks) != len(seeds):
            raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds.")
        for sidecar in self.sidecars:
            if (event := sidecar.ensure()) is not None:
                self.sidecar_events.append(event)
                print(f"env pool: {event}", file=sys.stderr, flush=True)
        self._lost.clear()
        self._episodes_of = [set() for _ in range(self.num_workers)]
        for eid in range(len(tasks)):
            self._episodes_of[eid % self.num_workers].add(eid)
        answers = self._call("reset", [[i, t.to_json(), int(s)] for i, (t, s) in
                                       enumerate(zip(tasks, seeds))])
        out = []
        for eid in range(len(tasks)):
            msg = answers[eid]
            failure = msg.get("failure") or msg.get("error")
            if failure:
                self._lost[eid] = failure
                out.append(ResetResult("", {}, failure=failure))
            else:
                out.append(ResetResult(msg["observation"], msg["info"]))
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        """One action per live episode; failed episodes come back done with `info["failure"]`."""
        out: dict[int, StepResult] = {}
        items = []
        for eid, action in actions.items():
            if eid in self._lost:
                out[eid] = _failed(self._lost[eid])
            else:
                items.append([eid, action])
        for eid, msg in self._call("step", items).items():
            failure = msg.get("failure") or msg.get("error")
            if failure:
                self._lost[eid] = failure
                out[eid] = _failed(failure)
            else:
                out[eid] = StepResult.from_json(msg["result"])
        return out

    def expert_actions(self, episodes: Sequence[int]) -> dict[int, str]:
        """The expert's next action per episode ("" for a failed episode)."""
        live = [[e] for e in episodes if e not in self._lost]
        answers = self._call("expert", live)
        out = {}
        for e in episodes:
            msg = answers.get(e, {})
            if "action" in msg:
                out[e] = msg["action"]
            else:
                self._lost.setdefault(e, msg.get("failure") or msg.get("error") or "failed")
                out[e] = ""
        return out

    def failure(self, episode: int) -> str | None:
        return self._lost.get(episode)


def open_pool(env: str, env_kwargs: Mapping[str, Any] | None = None, *,
              sidecar_log_dir: str | None = None, **pool_options) -> EnvPool:
    """An EnvPool with the processes its env depends on (`Env.start_sidecars`, e.g. Search-QA's
    retrieval service) started first; the pool checks and closes them."""
    from skilljax.envs.base import env_class
    sidecars, kwargs = env_class(env).start_sidecars(dict(env_kwargs or {}), sidecar_log_dir)
    try:
        return EnvPool(env, env_kwargs=kwargs, sidecars=sidecars, **pool_options)
    except BaseException:
        for sidecar in sidecars:
            sidecar.close()
        raise


def _of(items) -> str:
    return f" of episode {items[0][0]}" if items else ""


def _failed(reason: str) -> StepResult:
    return StepResult(observation="", reward=0.0, done=True, won=False, info={"failure": reason})
