"""One retrieval process that every Search-QA env worker queries over HTTP (Search-R1's and the
released SKILL0 code's setup): one copy of the index in memory, whatever the number of workers.

    python -m skilljax.envs.retrieval_service --index INDEX_DIR [--port 8000]
    python -m skilljax.envs.retrieval_service --source generated --kind bm25   # small corpora

`--index` serves an index built by `skilljax.envs.search_index` (BM25 or FAISS, memory-mapped);
`--source` (`generated`, or a Search-R1 data directory) serves the in-process retrievers of
`search_corpus` instead. The trainer starts it itself when a config sets
`env.kwargs.retriever="service"` with `service_index` (or `service_source`) and no `service_url`,
checks it before every batch of episodes, and restarts it on the same port when it died; episodes
whose request was in flight when it died fail with the reason, and the run goes on.

HTTP (FastAPI on uvicorn):
    GET  /health  → {"status": "ok", "kind", "passages", "source", "pid"}
    POST /search  {"queries": [str, ...], "k": int} → {"results": [[{id, title, text, score}]]}
A request waits at most `--request-timeout-s` (504 past it). Requests that arrive while the
index is busy are served together: one batched index call for all queries queued at that moment
(the env workers' calls of one turn become one or a few index calls).
"""


# No `from __future__ import annotations` here: FastAPI reads the request model's annotations.
import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
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
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.queue.get()]
            while not self.queue.empty() and sum(len(j[0]) for j in jobs) < self.max_batch:
                jobs.append(self.queue.get_nowait())
            queries = [q for j in jobs for q in j[0]]
            k = max(j[1] for j in jobs)
            try:
                hits = await loop.run_in_executor(None, self.searcher.search_batch, queries, k)
                self.calls += 1
            except Exception as e:  # noqa: BLE001  (reported to every waiting request)
                for j in jobs:
                    if not j[2].done():
                        j[2].set_exception(e)
                continue
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

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.run())
        while batcher.queue is None:
            await asyncio.sleep(0)
        if on_ready is not None:
            on_ready()
        yield
        task.cancel()

    app = FastAPI(title="skilljax retrieval service", lifespan=lifespan)

    class Query(BaseModel):
        queries: list[str] = Field(max_length=MAX_QUERIES)
        k: int = Field(default=3, ge=1, le=MAX_K)

    @app.get("/health")
    async def health():
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


def serve(searcher, about: dict, host: str = "127.0.0.1", port: int = 0,
          request_timeout_s: float = 30.0) -> None:
    """Serves until killed; prints `READY http://HOST:PORT` on stdout once it accepts requests."""
    import uvicorn
    sock = bind(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}"

    def ready():
        print(f"READY {url}", flush=True)
        os.dup2(2, 1)  # from here on, stdout (nobody reads it any more) goes to the log
        sys.stdout = sys.stderr

    app = make_app(searcher, about, request_timeout_s, on_ready=ready)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


# ---------------------------------------------------------------------------- the client

class ServiceClient:
    """What a Search-QA env worker holds in `retriever="service"` mode."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return json.loads(r.read())
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
        self.log_path = log_path or os.devnull
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._start()

    def _start(self) -> None:
        from skilljax.envs.pool import _PACKAGE_ROOT
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT] + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "skilljax.envs.retrieval_service", *self.args,
             "--port", str(self.port)], stdout=subprocess.PIPE, stderr=log, env=environ,
            start_new_session=True)
        log.close()
        line = _read_status(self.proc, self.start_timeout_s)
        if not line.startswith("READY "):
            self.close()
            raise EnvError(f"The retrieval service did not start ({line or 'no answer'}); "
                           f"its log: {self.log_path}.")
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
        for attempt in range(20):  # the old socket may linger for a moment
            try:
                self._start()
                break
            except EnvError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        self.restarts += 1
        return f"retrieval service {reason}; restarted at {self.url}"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()


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
    a = ap.parse_args(argv)
    try:
        searcher, about = open_searcher(a.index, a.source, a.kind, a.dense_model)
        searcher.search_batch(["warm up"], 1)
    except (EnvError, ValueError) as e:
        print(f"FAILED {e}", flush=True)
        raise SystemExit(str(e)) from None
    serve(searcher, about, a.host, a.port, a.request_timeout_s)


if __name__ == "__main__":
    main()
