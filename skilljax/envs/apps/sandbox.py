"""A sandbox for agent-written Python: one REPL-like interpreter process per episode.

SAGE's agent (AppWorld) acts by writing code cells that call app APIs (`apis.contacts.search(...)`).
`Sandbox` runs them in a child interpreter (`python -I -c <bootstrap>`, working directory = the
episode's scratch directory). The child runs `setup` first, unrestricted and trusted (it imports
modules, opens the episode's SQLite file, binds `apis`), then switches the restrictions on, then
runs cells one at a time in the namespace the setup left: names one cell defines are visible in the
next. As in a REPL, a cell ending in an expression prints its repr, and an exception prints its
last frames and message. Output (Python's streams and file descriptors 1 and 2 alike) goes to a
file the host reads after each cell, cut at `Limits.output_chars`.

Whatever a cell does, the next `run` works. A cell over its CPU or wall time gets an exception and
the namespace survives. A process that dies (os._exit, a segfault, SIGXCPU) or hangs is killed and
replaced; that cell's result has `restarted=True` and its output says the namespace is lost.

Threat model. The code comes from a policy under RL: mostly accidents (endless loops, huge lists, a
stray delete), sometimes reward hacking (reading files it should not, changing state other than
through the app APIs, reaching the network). The sandbox guards against those. It is NOT a security
boundary against code written to escape it: an audit hook lives inside the interpreter it watches,
and frame or closure introspection, an unaudited C entry point or a memory-corruption bug gets past
it. For real isolation run the whole trainer in a container or VM without credentials or network.

Enforced, and by what:
- kernel rlimits in the child, soft = hard so the code cannot raise them again: RLIMIT_AS
  (`memory_mb`), RLIMIT_FSIZE (`file_mb`; SIGXFSZ is ignored, so an oversized write raises
  OSError), RLIMIT_CORE 0, RLIMIT_NPROC 0 (no fork, no threads, but the kernel exempts root: the
  host lists "nproc" in `protections` only when it is not root), and RLIMIT_CPU, 1-2 s past each
  cell's allowance (whole seconds), as a backstop: SIGXCPU ends a cell stuck in C code;
- a network namespace ("netns"): where `unshare --net --map-root-user` works (no root needed, only
  unprivileged user namespaces), the child has no network interface at all, not even loopback;
- timers in the child: ITIMER_PROF (`cpu_s`) and ITIMER_REAL (`wall_s`) raise an exception derived
  from BaseException, so `except Exception` in the cell does not swallow it;
- the host kills the child's process group when a cell has not answered `_KILL_GRACE_S` after its
  wall time (stuck in C code, or it swallowed the timer's exception), and replaces any dead child;
- an audit hook (PEP 578), installed after setup, raises PermissionError for: sockets and the
  network modules; starting processes (subprocess, os.system, os.exec*, os.spawn*, os.posix_spawn,
  os.fork, os.forkpty, pty.spawn; `_posixsubprocess.fork_exec`, not audited, is replaced); ctypes
  (importing it, and every ctypes event); writing, creating, deleting, renaming, linking, chmod,
  chown, utime or truncate outside the scratch directory, symlinks pointing out of it, and shutil's
  copy/move/rmtree/archive calls that would do so; reading outside the scratch directory and
  Python's library (prefixes, sysconfig and site paths, sys.path, the skilljax package,
  /usr/share/zoneinfo, `read_paths`); opening directories outside the scratch directory; os.chdir
  out of it; SQLite databases outside it (and `sqlite3.connect` after setup returns connections
  that cannot ATTACH or VACUUM INTO; extension loading is refused); signals to other processes
  (os.kill, os.killpg; the pidfd functions, not audited, are replaced); changing rlimits; gc's
  object-graph walkers (they reach the hook's state);
- hygiene: a minimal environment (none of the host's tokens), HOME and TMPDIR = the scratch
  directory, stdin = /dev/null, `-I` (files in the scratch directory cannot shadow modules at the
  next start), no bytecode written, faulthandler off, recursion limit 1000.

Not enforced:
- listing and stat-ing outside the scratch directory (os.listdir, os.stat, glob);
- `os.open(..., dir_fd=)`: the "open" event does not carry dir_fd, so a relative path is judged
  against the working directory (directory descriptors outside the scratch directory are refused,
  which keeps this hard to exploit); a symlink swapped between the check and the open;
- files C code opens by itself: ATTACH or VACUUM INTO on a connection the setup opened (the setup
  should call `conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)`) or that a cell built with
  `sqlite3.Connection(...)` directly; an extension module's own I/O;
- threads when the host runs as root (Python 3.11 does not audit thread creation);
- disk use: `file_mb` bounds each file, not how many files the scratch directory holds;
- lines forged onto the protocol pipe: the host ignores lines without the request's random id,
  which stops accidents, not code that reads the id from the interpreter's frames;
- a child left behind by a host killed with SIGKILL while a cell sleeps with its timers disabled
  (a host that exits normally kills its children).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import faulthandler
import functools
import importlib
import io
import itertools
import json
import linecache
import math
import os
import pathlib
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Sequence

_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[3])
_THIS_FILE = __file__
_KILL_GRACE_S = 1.0        # the host kills a cell this long after its own wall timer should fire
_START_TIMEOUT_S = 60.0    # startup, setup included
_MAX_LINE_BYTES = 1 << 24  # a longer protocol line is garbage: the child counts as crashed
_MEMORY_FULL = 0.8         # address space in use (fraction of the limit) that leaves cells no room
_RECURSION_LIMIT = 1000
_TRACEBACK_FRAMES = 3      # frames shown for a cell's exception: the cell's line and the innermost
_LOST = "variables and functions from earlier cells are lost"


@dataclasses.dataclass(frozen=True)
class Limits:
    cpu_s: float = 5.0        # CPU seconds per cell
    wall_s: float = 10.0      # wall seconds per cell
    memory_mb: int = 512      # address space of the sandbox process
    output_chars: int = 4000  # stdout + stderr kept per cell, then a truncation marker
    file_mb: int = 16         # largest file the code may write

    def __post_init__(self):
        for name, value in dataclasses.asdict(self).items():
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}.")


@dataclasses.dataclass
class CellResult:
    output: str      # what the cell printed, then its error as a REPL shows it
    ok: bool         # no exception and not killed
    error: str       # "" or a short reason
    restarted: bool  # the process died or was killed and was replaced: the namespace is lost
    wall_s: float


class SandboxError(RuntimeError):
    """The sandbox could not start (missing interpreter, failing setup); says what to do."""


class _Died(Exception):
    pass


# ----------------------------------------------------------------------------- host side


@functools.cache
def _netns_prefix(python: str) -> tuple[str, ...]:
    """`unshare --net --map-root-user` when it runs this interpreter here, else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    prefix = (exe, "--net", "--map-root-user")
    try:
        proc = subprocess.run([*prefix, python, "-I", "-c", "pass"], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ()
    return prefix if proc.returncode == 0 else ()


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            try:  # the group takes anything the code started; the pid, in case it left the group
                kill()
            except OSError:
                pass
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass


def _rewind(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)  # the child shares this file offset


def _utf8(text) -> str:
    """`text` as a str that encodes to UTF-8 (JSON lets lone surrogates through)."""
    return str(text).encode("utf-8", "replace").decode("utf-8")


def _death(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        if -returncode == signal.SIGXCPU:
            return "cpu time limit exceeded (the process was killed)"
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if -returncode == signal.SIGKILL:
            return "the sandbox process was killed (SIGKILL; out of memory?)"
        return f"the sandbox process crashed ({name})"
    return f"the sandbox process exited with code {returncode}"


class Sandbox:
    """One sandboxed interpreter per episode (see the module docstring); `run` runs a cell."""

    def __init__(self, scratch_dir: str | os.PathLike, setup: str = "", limits: Limits = Limits(),
                 python: str = sys.executable, read_paths: Sequence[str] = (),
                 start_timeout_s: float = _START_TIMEOUT_S):
        self.scratch_dir = os.path.realpath(scratch_dir)
        os.makedirs(self.scratch_dir, exist_ok=True)
        self.setup = setup
        self.limits = limits
        self.python = python
        self.read_paths = [os.path.realpath(p) for p in read_paths]  # also readable by the code
        self.start_timeout_s = start_timeout_s
        self.protections: list[str] = []  # what guards the running child; filled by start()
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._out = None  # the child's fds 1 and 2: a file the host reads each cell's output from
        self._buf = b""
        self._finalizer = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Starts the child and runs the setup (`run` calls it when needed)."""
        if self._proc is not None:
            return
        prefix = _netns_prefix(self.python)
        if self._out is None:
            self._out = tempfile.TemporaryFile(prefix="skilljax_sandbox_")
        _rewind(self._out.fileno())
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": self.scratch_dir,
               "TMPDIR": self.scratch_dir, "LANG": "C.UTF-8"}
        if "TZ" in os.environ:
            env["TZ"] = os.environ["TZ"]
        # -I ignores PYTHONPATH (and the working directory): the bootstrap puts them back in order.
        path = [_PACKAGE_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                  if p]
        bootstrap = (f"import sys; sys.dont_write_bytecode = True; sys.path[:0] = {path!r}; "
                     "from skilljax.envs.apps import sandbox; sandbox._child_main()")
        try:
            proc = subprocess.Popen(
                [*prefix, self.python, "-I", "-c", bootstrap], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._out, cwd=self.scratch_dir, env=env,
                start_new_session=True)  # its own process group: one killpg ends all of it
        except OSError as e:
            raise SandboxError(f"Could not start the sandbox with {self.python}: {e}.") from None
        self._proc, self._buf = proc, b""
        self._finalizer = weakref.finalize(self, _kill, proc)
        token = secrets.token_hex(8)
        config = {"scratch": self.scratch_dir, "setup": self.setup,
                  "limits": dataclasses.asdict(self.limits), "read_paths": self.read_paths,
                  "package_root": _PACKAGE_ROOT}
        try:
            self._send({"id": token, "config": config})
            msg = self._recv(token, time.monotonic() + self.start_timeout_s)
        except (_Died, TimeoutError) as e:
            self._stop()
            raise SandboxError(
                f"The sandbox did not start ({e or 'timed out'}) with {self.python}; its output:\n"
                f"{self._read_output()}") from None
        if not msg.get("ready"):
            self._stop()
            raise SandboxError(f"The sandbox's setup failed; fix the setup code:\n{msg['error']}")
        self.protections = list(msg["protections"])
        if os.geteuid() != 0:
            self.protections.insert(1, "nproc")
        if prefix:
            self.protections.append("netns")

    def reset(self) -> None:
        """A fresh process: new namespace, setup run again."""
        self._stop()
        self.start()

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._send({"cmd": "shutdown"})
                self._proc.wait(timeout=1)
            except (_Died, subprocess.TimeoutExpired):
                pass
        self._stop()
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def _stop(self) -> int | None:
        """Kills the child (if any); its exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        self._finalizer.detach()
        _kill(proc)
        return proc.returncode

    # ---------------------------------------------------------------- protocol

    def _send(self, obj) -> None:
        try:
            self._proc.stdin.write((json.dumps(obj) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:
            raise _Died("the sandbox process has exited") from e

    def _recv(self, token: str, deadline: float) -> dict:
        """The child's answer carrying `token`; other lines are ignored (the code may write on the
        pipe). `_Died` on EOF, `TimeoutError` at the deadline."""
        fd = self._proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.get("id") == token:
                    return msg
            if len(self._buf) > _MAX_LINE_BYTES:
                raise _Died("the sandbox process wrote garbage on its answer pipe")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise _Died("the sandbox process closed its answer pipe")
                self._buf += chunk

    def _read_output(self) -> str:
        cap = self.limits.output_chars
        fd = self._out.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, 4 * cap + 4), 0)
        text = data.decode("utf-8", "replace")
        if len(text) > cap or size > len(data):
            text = text[:cap] + f"\n[... output truncated to its first {cap} characters]\n"
        return text

    # ---------------------------------------------------------------- cells

    def run(self, code: str) -> CellResult:
        """Runs one cell in the episode's namespace; never raises for anything the code does."""
        notes = []
        restarted = False
        if self._proc is not None and self._proc.poll() is not None:  # died between cells
            notes.append(f"[Between cells, {_death(self._stop())}. Restarted the sandbox process: "
                         f"{_LOST}.]\n")
            restarted = True
            self.restarts += 1
        self.start()
        token = secrets.token_hex(8)
        _rewind(self._out.fileno())
        t0 = time.monotonic()
        msg, failure = None, None
        try:
            self._send({"id": token, "code": code})
            msg = self._recv(token, t0 + self.limits.wall_s + _KILL_GRACE_S)
        except TimeoutError:
            failure = (f"TimeoutError: cell exceeded {self.limits.wall_s:g} s wall time (the "
                       "process was killed)")
        except _Died as e:
            try:  # a dying process closes its pipe a moment before it can be reaped
                self._proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                failure = str(e)  # alive: it broke the protocol
        wall_s = time.monotonic() - t0
        output = "".join(notes) + self._read_output()
        if msg is not None and not msg.get("fatal"):
            return CellResult(output=output + _utf8(msg["report"]), ok=bool(msg["ok"]),
                              error=_utf8(msg["error"]), restarted=restarted, wall_s=wall_s)
        # The child is gone, hung, or asked to be replaced: start a fresh one.
        returncode = self._stop()
        if msg is not None:
            error, report, why = _utf8(msg["error"]), _utf8(msg["report"]), _utf8(msg["fatal"])
        else:
            error = failure or _death(returncode)
            report, why = "", error
        self.restarts += 1
        self.start()
        note = f"[{why}. Restarted the sandbox process: {_LOST}.]\n"
        return CellResult(output=output + report + note, ok=False, error=error, restarted=True,
                          wall_s=wall_s)


# ----------------------------------------------------------------------------- child side


class _CellLimit(BaseException):
    """A cell ran out of CPU or wall time (BaseException: `except Exception` does not catch it)."""


class _Capped(io.TextIOBase):
    """sys.stdout and sys.stderr in the child: writes through to fd 1, dropping what passes `cap`
    characters per cell (so a print loop cannot fill the disk)."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, cap: int):
        self.cap = cap
        self.written = 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1

    def close(self) -> None:  # a cell closing sys.stdout must not break the next cell
        pass

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.cap - self.written
        if room > 0:
            data = s[:room].encode("utf-8", "backslashreplace")
            while data:
                data = data[os.write(1, data):]
        self.written += len(s)
        return len(s)


def _refuse(message: str):
    def refused(*args, **kwargs):
        raise PermissionError(message)
    return refused


_NETWORK = "network access is blocked in the sandbox"
_PROCESSES = "starting processes is blocked in the sandbox"
_CTYPES = "ctypes is blocked in the sandbox"
_SIGNALS = "sending signals to other processes is blocked in the sandbox"
_PROCESS_EVENTS = frozenset(("os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
                             "os.forkpty", "pty.spawn", "subprocess.Popen", "os.startfile",
                             "webbrowser.open"))
_NETWORK_PREFIXES = ("socket.", "urllib.Request", "http.client.", "ftplib.", "smtplib.", "poplib.",
                     "imaplib.", "nntplib.", "telnetlib.")


def _make_hook(scratch: str, read_roots: Sequence[str], allow_rlimits: list[bool]):
    """The audit hook: PermissionError for what the module docstring lists."""
    # Bound now, so a cell that reassigns os.path.realpath & co. does not steer the checks.
    sep, devnull = os.sep, os.devnull
    realpath, join, dirname, isabs, isdir = (os.path.realpath, os.path.join, os.path.dirname,
                                             os.path.isabs, os.path.isdir)
    getcwd, readlink, fsdecode, fspath = os.getcwd, os.readlink, os.fsdecode, os.fspath
    getpid, getpgrp = os.getpid, os.getpgrp
    readable_files = {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}

    def under(path, roots):
        return any(path == r or path.startswith(r + sep) for r in roots)

    def resolve(path, dir_fd=None):
        """The absolute, symlink-free path, or None when it cannot be told (then it is refused)."""
        try:
            if isinstance(path, int):  # a descriptor: what it is open on
                return readlink(f"/proc/self/fd/{path}")
            path = fsdecode(fspath(path))
            if isinstance(dir_fd, int) and dir_fd >= 0 and not isabs(path):
                base = readlink(f"/proc/self/fd/{dir_fd}")
            else:
                base = getcwd()
            return realpath(join(base, path))
        except (OSError, TypeError, ValueError):
            return None

    def write(path, dir_fd=None, what="writing"):
        real = resolve(path, dir_fd)
        if real is None or not (under(real, (scratch,)) or real == devnull):
            raise PermissionError(f"{what} {path!r} is blocked in the sandbox: code may change "
                                  "files only under its working directory")

    def read(path, dir_fd=None):
        real = resolve(path, dir_fd)
        if real is not None and (under(real, (scratch,)) or real in readable_files
                                 or (under(real, read_roots) and not isdir(real))):
            return
        raise PermissionError(f"reading {path!r} is blocked in the sandbox: code may read only its "
                              "working directory and Python's library")

    def arg(args, i):
        return args[i] if i is not None and i < len(args) else None

    def writes(*pairs):  # (index of a path argument, index of its dir_fd argument or None)
        def check(args):
            for i, fd_i in pairs:
                if i < len(args) and args[i] is not None:
                    write(args[i], arg(args, fd_i))
        return check

    def on_open(args):
        path, mode, flags = args
        if isinstance(path, int):  # wraps a descriptor the process already holds
            return
        if isinstance(flags, int):
            writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC)
        else:
            writing = any(c in (mode or "") for c in "wax+")
        (write if writing else read)(path)

    def on_copy(args):  # (src, dst)
        read(args[0])
        write(args[1])

    def on_move(args):
        write(args[0])
        write(args[1])

    def on_symlink(args):  # (target, link, dir_fd): the target, read from the link's directory
        write(args[1], arg(args, 2))
        link_dir = dirname(resolve(args[1], arg(args, 2)) or "")
        write(join(link_dir, fsdecode(args[0])), what="a symlink to")

    def on_chdir(args):
        write(args[0], what="changing directory to")

    def on_make_archive(args):  # (base_name, format, root_dir, base_dir)
        write(args[0])
        if args[2] is not None:
            write(args[2], what="archiving")

    def on_unpack_archive(args):  # (filename, extract_dir, format)
        read(args[0])
        write(args[1] if args[1] is not None else ".")

    def on_kill(args):
        if args[0] not in (0, getpid()):
            raise PermissionError(_SIGNALS)

    def on_killpg(args):
        if args[0] not in (0, getpgrp()):
            raise PermissionError(_SIGNALS)

    def on_rlimit(args):
        if not allow_rlimits[0] and not (len(args) == 3 and args[2] is None):  # prlimit queries
            raise PermissionError("changing resource limits is blocked in the sandbox")

    def on_sqlite_connect(args):
        name = fsdecode(fspath(args[0]))
        if name.startswith("file:"):  # a URI: its path part
            name = name[len("file:"):].split("?")[0]
        if name not in ("", ":memory:"):
            write(name, what="opening the database")

    def on_load_extension(args):
        if len(args) < 2 or args[1]:
            raise PermissionError("loading SQLite extensions is blocked in the sandbox")

    def on_import(args):
        name = args[0]
        if name in ("ctypes", "_ctypes") or name.startswith("ctypes."):
            raise PermissionError(_CTYPES)
        if name == "_posixsubprocess":
            raise PermissionError(_PROCESSES)

    def on_gc(args):
        raise PermissionError("walking the object graph (gc.get_objects/get_referrers/"
                              "get_referents) is blocked in the sandbox")

    handlers = {
        "open": on_open,
        "os.chdir": on_chdir,
        "os.remove": writes((0, 1)), "os.rmdir": writes((0, 1)), "os.mkdir": writes((0, 2)),
        "os.chmod": writes((0, 2)), "os.chown": writes((0, 3)), "os.utime": writes((0, 3)),
        "os.truncate": writes((0, None)), "os.rename": writes((0, 2), (1, 3)),
        "os.link": writes((0, 2), (1, 3)), "os.symlink": on_symlink,
        "os.setxattr": writes((0, None)), "os.removexattr": writes((0, None)),
        "os.chflags": writes((0, None)), "os.lchflags": writes((0, None)),
        "shutil.rmtree": writes((0, 1)), "shutil.chown": writes((0, None)),
        "shutil.copyfile": on_copy, "shutil.copymode": on_copy, "shutil.copystat": on_copy,
        "shutil.copytree": on_copy, "shutil.move": on_move,
        "shutil.make_archive": on_make_archive, "shutil.unpack_archive": on_unpack_archive,
        "os.kill": on_kill, "os.killpg": on_killpg,
        "resource.setrlimit": on_rlimit, "resource.prlimit": on_rlimit,
        "sqlite3.connect": on_sqlite_connect,
        "sqlite3.enable_load_extension": on_load_extension,
        "sqlite3.load_extension": on_load_extension,
        "import": on_import,
        "gc.get_objects": on_gc, "gc.get_referrers": on_gc, "gc.get_referents": on_gc,
    }

    def hook(event, args):
        handler = handlers.get(event)
        if handler is not None:
            handler(args)
        elif event in _PROCESS_EVENTS:
            raise PermissionError(f"{_PROCESSES} ({event})")
        elif event.startswith(_NETWORK_PREFIXES):
            raise PermissionError(_NETWORK)
        elif event.startswith("ctypes."):
            raise PermissionError(_CTYPES)

    return hook


def _no_sqlite_attach() -> None:
    """Connections opened by `sqlite3.connect` from now on cannot ATTACH (nor VACUUM INTO) a
    database: SQLite would open that file itself, unseen by the audit hook."""
    try:
        import sqlite3
    except ImportError:
        return
    connect = sqlite3.connect
    if not hasattr(sqlite3.Connection, "setlimit"):  # Python < 3.11
        return

    @functools.wraps(connect)
    def connect_without_attach(*args, **kwargs):
        connection = connect(*args, **kwargs)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        return connection

    sqlite3.connect = sqlite3.dbapi2.connect = connect_without_attach


def _read_roots(config) -> list[str]:
    """Where the code may read besides the scratch directory: Python's library and skilljax."""
    import site
    import sysconfig

    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  *sysconfig.get_paths().values(), *site.getsitepackages(), *sys.path,
                  os.path.join(config["package_root"], "skilljax"), "/usr/share/zoneinfo",
                  *config["read_paths"]]
    roots = {os.path.realpath(c) for c in candidates if c}
    # Not the repository root (sys.path has it, for the package): only the package itself.
    return sorted(roots - {os.sep, os.path.realpath(config["package_root"])})


class _Guard:
    """The child's restrictions: installed once after setup, timers armed around each cell."""

    def __init__(self, config, limits: Limits):
        self.limits = limits
        self.armed = False
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)  # opened before the hook forbids it
        used, cap = self.address_space(), limits.memory_mb << 20
        if used >= _MEMORY_FULL * cap:
            raise SandboxError(f"After setup the process already maps {used >> 20} MiB, which "
                               f"leaves cells no room under memory_mb={limits.memory_mb}: raise "
                               "it.")
        for res, value in ((resource.RLIMIT_AS, cap), (resource.RLIMIT_FSIZE, limits.file_mb << 20),
                           (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
            hard = resource.getrlimit(res)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(res, (value, value))  # soft = hard: the code cannot raise it again
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises, does not kill
        messages = {signal.SIGPROF: f"cpu time limit exceeded ({limits.cpu_s:g} s per cell)",
                    signal.SIGALRM: f"TimeoutError: cell exceeded {limits.wall_s:g} s wall time"}

        def on_timer(signum, frame):
            if self.armed:
                self.armed = False
                raise _CellLimit(messages[signum])

        for signum in messages:
            signal.signal(signum, on_timer)
        sys.setrecursionlimit(_RECURSION_LIMIT)
        faulthandler.disable()
        # Entry points the audit hook does not see.
        for module, name, message in (("_posixsubprocess", "fork_exec", _PROCESSES),
                                      ("os", "pidfd_open", _SIGNALS),
                                      ("posix", "pidfd_open", _SIGNALS),
                                      ("signal", "pidfd_send_signal", _SIGNALS),
                                      ("_signal", "pidfd_send_signal", _SIGNALS)):
            try:
                mod = importlib.import_module(module)
            except ImportError:
                continue
            if hasattr(mod, name):
                setattr(mod, name, _refuse(message))
        _no_sqlite_attach()
        allow_rlimits = [False]

        def set_cpu_limit(seconds: int) -> None:
            hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
            soft = seconds if hard == resource.RLIM_INFINITY else min(seconds, hard)
            allow_rlimits[0] = True
            try:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
            finally:
                allow_rlimits[0] = False

        self._set_cpu_limit = set_cpu_limit
        sys.addaudithook(_make_hook(config["scratch"], _read_roots(config), allow_rlimits))
        self.protections = ["rlimits", "audit-hook"]

    def address_space(self) -> int:
        fields = os.pread(self._statm, 128, 0).split()
        return int(fields[0]) * os.sysconf("SC_PAGE_SIZE")

    def memory_full(self) -> bool:
        return self.address_space() >= _MEMORY_FULL * (self.limits.memory_mb << 20)

    def arm(self) -> None:
        used = sum(os.times()[:2])
        # The kernel's backstop, 1-2 s after the timer's exception, for code stuck in C.
        self._set_cpu_limit(math.ceil(used + self.limits.cpu_s) + 1)
        self.armed = True
        signal.setitimer(signal.ITIMER_PROF, self.limits.cpu_s)
        signal.setitimer(signal.ITIMER_REAL, self.limits.wall_s)

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)


def _describe(e: BaseException, filename: str, max_chars: int) -> tuple[str, str]:
    """(short error, REPL-style report): the innermost frames from the cell on, and the message."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next  # the sandbox's own frames before the cell
    frames = [f for f in traceback.extract_tb(tb) if f.filename != _THIS_FILE]
    if len(frames) > _TRACEBACK_FRAMES:
        frames = [frames[0], *frames[1 - _TRACEBACK_FRAMES:]]
    if isinstance(e, _CellLimit):
        last = [f"{e}\n"]
    else:
        last = traceback.format_exception_only(type(e), e)
    report = (("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
               if frames else "") + "".join(last))
    lines = [line for line in "".join(last).splitlines() if line.strip()]
    error = lines[-1].strip() if lines else type(e).__name__
    if len(report) > max_chars:
        report = "...\n" + report[-max_chars:]
    return error[:300], report


def _run_cell(code: str, filename: str, namespace: dict, guard: _Guard) -> dict:
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        guard.arm()
        try:
            tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, filename, "exec"), namespace)
            if last is not None:  # a REPL shows the value of a final expression
                value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
                if value is not None:
                    print(repr(value))
        finally:
            guard.disarm()
    except BaseException as e:  # everything the cell does is the cell's result
        guard.disarm()
        try:
            error, report = _describe(e, filename, max(guard.limits.output_chars, 2000))
        except MemoryError:
            error, report = "MemoryError", "MemoryError\n"
        reply = {"ok": False, "error": error, "report": report}
        if isinstance(e, MemoryError):
            del e
            if guard.memory_full():  # the namespace holds the memory: only a new process helps
                reply["fatal"] = "MemoryError: the cell's memory stayed allocated"
        return reply
    return {"ok": True, "error": "", "report": ""}


def _child_main() -> None:
    """The sandbox process: requests on fd 0, answers on a private copy of fd 1 (JSON lines)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # input() meets end of file instead of the protocol
    os.close(null)
    os.dup2(2, 1)  # fd 1 and 2: the host's output file
    dumps, loads = json.dumps, json.loads  # a cell may replace json's functions

    def send(obj) -> None:
        data = (dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(answers, data):]

    first = loads(requests.readline())
    config = first["config"]
    limits = Limits(**config["limits"])
    stream = _Capped(limits.output_chars + 1)  # one more than kept, so the host sees the cut
    sys.stdout = sys.stderr = stream
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        linecache.cache["<setup>"] = (len(config["setup"]), None,
                                      config["setup"].splitlines(True), "<setup>")
        exec(compile(config["setup"], "<setup>", "exec"), namespace)
        guard = _Guard(config, limits)
    except BaseException:
        send({"id": first["id"], "ready": False, "error": traceback.format_exc()})
        return
    send({"id": first["id"], "ready": True, "protections": guard.protections})
    for count in itertools.count(1):
        line = requests.readline()
        if not line:
            return
        request = loads(line)
        if "code" not in request:  # shutdown
            return
        stream.written = 0
        reply = _run_cell(request["code"], f"<cell {count}>", namespace, guard)
        sys.stdout = sys.stderr = stream  # the cell may have replaced them
        reply["id"] = request["id"]
        send(reply)
        if reply.get("fatal"):
            return
