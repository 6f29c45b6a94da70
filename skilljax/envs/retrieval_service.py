"""One retrieval process that every Search-QA env worker queries over HTTP (Search-R1's and the
released SKILL0 code's setup): one copy of the index in memory, whatever the number of workers.

    python -m skilljax.envs.retrieval_service --index INDEX_DIR [--port 8000]
    python -m skilljax.envs.retrieval_service --source generated --kind bm25   # small corpora

`--index` serves an index built by `skilljax.envs.search_index` (BM25 or FAISS, memory-mapped);
`--source` (`generated`, or a Search-R1 data directory) serves the in-process retrievers of
`search_corpus` instead (`--kind`, `--dense-model` apply to it; an index carries its own). The trainer starts it itself when a config sets
`env.kwargs.retriever="service"` with `service_index` (or `service_source`) and no `service_url`,
checks it before every batch of episodes, and restarts it on the same port when it died; episodes
whose request was in flight when it died fail with the reason, and the run goes on.

HTTP (FastAPI on uvicorn):
    GET  /health  → {"status": "ok", "kind", "passages", "source", "pid", "index_calls"}
                    (503 when its search loop has stopped)
    POST /search  {"queries": [str, ...], "k": int} → {"results": [[{id, title, text, score}]]}
A request waits at most `--request-timeout-s` (504 past it). Requests that arrive while the
index is busy are served together: one batched index call for all queries queued at that moment
(the env workers' calls of one turn become one or a few index calls).
"""


# No `from __future__ import annotations` here: FastAPI reads the request model's annotations.
import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from skilljax.envs.base import EnvError

MAX_QUERIES = 4096   # per request
MAX_K = 100


# ---------------------------------------------------------------------------- the service

def open_searcher(index: str | None = None, source: str | None = None, kind: str = "bm25",
                  dense_model: str | None = None):
    """(searcher with `search_batch`, description) for `--index` or `--source`."""
    if (index is None) == (source is None):
        raise ValueError("Give exactly one of --index INDEX_DIR or --source generated|DATA_DIR.")
    if index is not None:
        from skilljax.envs.search_index import open_index
        ix = open_index(index)
        return ix, {"kind": ix.kind, "passages": len(ix), "source": str(Path(index).resolve())}
    from skilljax.envs.search_corpus import GENERATED, retriever_for
    src = source if source == GENERATED else str(Path(source).resolve())
    r = retriever_for(src, kind, dense_model)
    return r, {"kind": kind, "passages": len(r.corpus), "source": src}


class _Batcher:
    """Queues queries and runs them in one `search_batch` call per round, on one thread (the
    index is never searched from two threads at once)."""

    def __init__(self, searcher, max_batch: int = 1024):
        self.searcher, self.max_batch = searcher, max_batch
        self.queue: asyncio.Queue | None = None
        self.calls = 0

    async def run(self) -> None:
        self.queue = asyncio.Queue()
        while True:
            jobs = [await self.queue.get()]
            while not self.queue.empty() and sum(len(j[0]) for j in jobs) < self.max_batch:
                jobs.append(self.queue.get_nowait())
            jobs = [j for j in jobs if not j[2].done()]  # those that timed out are not searched
            if not jobs:
                continue
            try:
                await self._answer(jobs)
            except Exception:  # noqa: BLE001  (one request's fault must not fail the others)
                for job in jobs:
                    if not job[2].done():
                        try:
                            await self._answer([job])
                        except Exception as e:  # noqa: BLE001
                            job[2].set_exception(e)

    async def _answer(self, jobs) -> None:
        """One `search_batch` for all queries of `jobs` (at the largest k; each request gets its
        own k of its own queries)."""
        queries = [q for j in jobs for q in j[0]]
        k = max(j[1] for j in jobs)
        hits = await asyncio.get_running_loop().run_in_executor(
            None, self.searcher.search_batch, queries, k)
        self.calls += 1
        at = 0
        for qs, kk, fut in jobs:
            if not fut.done():
                fut.set_result([h[:kk] for h in hits[at:at + len(qs)]])
            at += len(qs)

    async def search(self, queries: list[str], k: int) -> list[list[dict]]:
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((queries, k, fut))
        return await fut


def make_app(searcher, about: dict[str, Any], request_timeout_s: float = 30.0, on_ready=None):
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel, Field

    batcher = _Batcher(searcher)
    running: list[asyncio.Task] = []

    @asynccontextmanager
    async def lifespan(app):
        running.append(asyncio.create_task(batcher.run()))
        while batcher.queue is None:
            await asyncio.sleep(0)
        if on_ready is not None:
            on_ready()
        yield
        running[0].cancel()

    app = FastAPI(title="skilljax retrieval service", lifespan=lifespan)

    class Query(BaseModel):
        queries: list[str] = Field(max_length=MAX_QUERIES)
        k: int = Field(default=3, ge=1, le=MAX_K)

    @app.get("/health")
    async def health():
        if not running or running[0].done():  # searches could only time out: say so
            raise HTTPException(503, "the search loop has stopped; restart the service")
        return dict(about, status="ok", pid=os.getpid(), index_calls=batcher.calls)

    @app.post("/search")
    async def search(q: Query):
        try:
            results = await asyncio.wait_for(batcher.search(q.queries, q.k), request_timeout_s)
        except asyncio.TimeoutError:
            raise HTTPException(504, f"no answer within {request_timeout_s:g} s") from None
        except Exception as e:  # noqa: BLE001
            raise HTTPException(500, f"search failed: {type(e).__name__}: {e}") from None
        return {"results": results}

    return app


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections made before uvicorn accepts wait in the backlog
    return sock


def serve(searcher, about: dict, sock: socket.socket, request_timeout_s: float = 30.0) -> None:
    """Serves on `sock` (from `bind`) until killed; prints `READY http://HOST:PORT` on stdout
    once it accepts requests."""
    import uvicorn
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"

    def ready():
        print(f"READY {url}", flush=True)
        os.dup2(2, 1)  # from here on, stdout (nobody reads it any more) goes to the log
        sys.stdout = sys.stderr

    app = make_app(searcher, about, request_timeout_s, on_ready=ready)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


# ---------------------------------------------------------------------------- the client

class ServiceClient:
    """What a Search-QA env worker holds in `retriever="service"` mode. `timeout_s`: the
    service's own request timeout; the client waits 5 s more, so the service's 504 arrives."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s + 5.0

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return json.loads(r.read())
        except (http.client.HTTPException, json.JSONDecodeError) as e:
            raise EnvError(f"The retrieval service at {self.url} sent a broken answer to {path} "
                           f"({type(e).__name__}: {e}); is it a skilljax retrieval service?") \
                from None
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            raise EnvError(f"The retrieval service at {self.url} answered {e.code} to {path}: "
                           f"{detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise EnvError(
                f"The retrieval service at {self.url} is unreachable or timed out "
                f"({type(reason).__name__}: {reason}). Start it (python -m "
                "skilljax.envs.retrieval_service --index INDEX_DIR), or let the trainer run it: "
                "env.kwargs.service_index=INDEX_DIR with service_url empty.") from None

    def health(self) -> dict:
        return self._call("/health")

    def search_batch(self, queries: list[str], k: int) -> list[list[dict]]:
        if not queries:
            return []
        return self._call("/search", {"queries": list(queries), "k": int(k)})["results"]

    def search(self, query: str, k: int) -> list[dict]:
        return self.search_batch([query], k)[0]


# ---------------------------------------------------------------------------- the process

class ServiceProcess:
    """A retrieval service run by the trainer: started on a free port, checked with `ensure()`
    before every batch of episodes and restarted on the same port when it died."""

    def __init__(self, *, index: str | None = None, source: str | None = None,
                 kind: str = "bm25", dense_model: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, start_timeout_s: float = 300.0, request_timeout_s: float = 30.0,
                 log_path: str | None = None):
        self.args = ["--host", host, "--request-timeout-s", str(request_timeout_s)]
        if index is not None:
            self.args += ["--index", str(index)]
        if source is not None:
            self.args += ["--source", str(source), "--kind", kind]
        if dense_model:
            self.args += ["--dense-model", dense_model]
        self.host, self.port = host, port
        self.start_timeout_s = start_timeout_s
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="skilljax_retrieval_", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._start()

    def _start(self) -> None:
        from skilljax.envs.pool import _PACKAGE_ROOT
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT] + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
        with open(self.log_path, "ab") as log:
            # stdin stays open as the child's link to us: it exits when this process is gone,
            # however it ended (its own session keeps a Ctrl-C in the terminal from reaching it).
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "skilljax.envs.retrieval_service", *self.args,
                 "--port", str(self.port), "--parent-link"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=environ, start_new_session=True)
        line = _read_status(self.proc, self.start_timeout_s)
        if not line.startswith("READY "):
            self.close()
            raise EnvError(f"The retrieval service did not start: {line or 'no answer'}. Its log "
                           f"({self.log_path}) ends with:\n{_tail(self.log_path)}")
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart binds the same port

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            ServiceClient(self.url, timeout_s=10.0).health()
            return True
        except EnvError:
            return False

    def ensure(self) -> str | None:
        """Restarts the service if it is down; the reason, or None when it was up."""
        if self.alive():
            return None
        reason = (f"exited with code {self.proc.returncode}" if self.proc.poll() is not None
                  else "stopped answering")
        self.close()
        for attempt in range(10):  # retried only while the port is taken (e.g. not yet freed)
            try:
                self._start()
                break
            except EnvError as e:
                if attempt == 9 or "Address already in use" not in str(e):
                    raise
                time.sleep(0.5)
        self.restarts += 1
        return f"retrieval service {reason}; restarted at {self.url}"

    def close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: it and anything it started
            except ProcessLookupError:
                pass
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f:
                try:
                    f.close()
                except OSError:
                    pass


def _tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _exit_with_parent() -> None:
    """Exits this process when its stdin (the parent's pipe) reaches end of file."""
    def watch():
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def _read_status(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first `READY ...` or `FAILED ...` line `proc` prints within `timeout_s` (other lines
    skipped; "" when it exits or stays silent)."""
    out: list[str] = []

    def read():
        for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith(("READY ", "FAILED ")):
                out.append(line)
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0] if out else ""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", default=None, help="an index directory (search_index)")
    ap.add_argument("--source", default=None, help="'generated' or a Search-R1 data directory")
    ap.add_argument("--kind", default="bm25", choices=("bm25", "dense"), help="with --source")
    ap.add_argument("--dense-model", default=None, help="with --source --kind dense")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: any free port")
    ap.add_argument("--request-timeout-s", type=float, default=30.0)
    ap.add_argument("--parent-link", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.parent_link:
        _exit_with_parent()
    try:
        sock = bind(a.host, a.port)  # first: a taken port is known before the index loads
        searcher, about = open_searcher(a.index, a.source, a.kind, a.dense_model)
        searcher.search_batch(["warm up"], 1)
    except Exception as e:  # noqa: BLE001  (whatever it is, the parent gets the reason)
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        raise SystemExit(1) from None
    serve(searcher, about, sock, a.request_timeout_s)


if __name__ == "__main__":
    main()
