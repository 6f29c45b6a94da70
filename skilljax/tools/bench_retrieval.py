"""Retrieval service load test: W env-worker processes × Q concurrent queries against one service
over a synthetic corpus, built in a temporary directory.

    python -m skilljax.tools.bench_retrieval [--passages 1000000] [--workers 8] [--queries 64]
        [--rounds 5] [--mode batch|single] [--out DIR]

The corpus: `--passages` passages of 20–40 words drawn (Zipf, s = 1.1) from a 50,000-word
vocabulary; it is indexed with BM25 (`search_index`, memory-mapped). Each worker process plays
`--rounds` turns; in a turn it sends its `--queries` queries (5 words each) either as one request
(`batch`: what a Search-QA env worker does with its episodes' searches of one turn) or as that many
concurrent one-query requests (`single`). Reported: per-request latency p50/p99, queries per second
over the whole run, the service's resident memory with 1 worker and with W workers (one copy of
the index whatever the number of clients), a worker's resident memory, and the index build time.
The last stdout line is JSON with everything.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

VOCAB = 50_000


def _words(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.zipf(1.1, n) - 1) % VOCAB


def write_corpus(path: Path, passages: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for start in range(0, passages, 10_000):
            n = min(10_000, passages - start)
            lengths = rng.integers(20, 41, n)
            words = _words(rng, int(lengths.sum()))
            at = 0
            for i, length in enumerate(lengths):
                text = " ".join(f"w{w}" for w in words[at:at + length])
                at += length
                f.write(json.dumps({"id": str(start + i), "contents": f'"T{start + i}"\n{text}'})
                        + "\n")


def queries_for(worker: int, rounds: int, per_round: int) -> list[list[str]]:
    rng = np.random.default_rng(1000 + worker)
    return [[" ".join(f"w{w}" for w in _words(rng, 5)) for _ in range(per_round)]
            for _ in range(rounds)]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _worker(args) -> dict:
    url, worker, rounds, per_round, mode, start_at = args
    from skilljax.envs.retrieval_service import ServiceClient
    client = ServiceClient(url, timeout_s=120.0)
    turns = queries_for(worker, rounds, per_round)
    while time.time() < start_at:
        time.sleep(0.001)
    latencies, hits = [], 0

    def one(qs):
        t = time.perf_counter()
        out = client.search_batch(qs, 3)
        latencies.append(time.perf_counter() - t)
        return sum(len(r) for r in out)

    with concurrent.futures.ThreadPoolExecutor(per_round if mode == "single" else 1) as ex:
        for qs in turns:
            if mode == "batch":
                hits += one(qs)
            else:
                hits += sum(ex.map(lambda q: one([q]), qs))
    return {"latencies": latencies, "hits": hits, "rss_mb": rss_mb(os.getpid())}


def run(passages: int, workers: int, queries: int, rounds: int, mode: str,
        out: str | None = None) -> dict:
    from skilljax.envs import search_index
    from skilljax.envs.retrieval_service import ServiceClient, ServiceProcess
    tmp = tempfile.TemporaryDirectory(prefix="skilljax_bench_retrieval_")
    root = Path(out or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.jsonl"
    t0 = time.time()
    if not corpus.exists():
        write_corpus(corpus, passages)
    t1 = time.time()
    index = search_index.build(str(corpus), "bm25", root / "index", progress=False)
    t2 = time.time()
    service = ServiceProcess(index=str(index), start_timeout_s=900.0)
    try:
        pid = service.proc.pid
        report = {"passages": json.loads((Path(index) / "index.json").read_text())["passages"],
                  "workers": workers, "queries_per_worker": queries,
                  "rounds": rounds, "mode": mode, "corpus_write_s": round(t1 - t0, 1),
                  "index_build_s": round(t2 - t1, 1),
                  "index_bytes": sum(p.stat().st_size for p in Path(index).rglob("*")
                                     if p.is_file()),
                  "service_rss_mb_idle": round(rss_mb(pid), 1)}
        ctx = mp.get_context("spawn")
        for n in (1, workers):
            with ctx.Pool(n) as pool:
                start_at = time.time() + 2.0
                t = time.time()
                results = pool.map(_worker, [(service.url, w, rounds, queries, mode, start_at)
                                             for w in range(n)])
                wall = time.time() - max(t, start_at)
            lat = sorted(x for r in results for x in r["latencies"])
            report[f"w{n}"] = {
                "requests": len(lat), "queries": n * rounds * queries,
                "p50_ms": round(1000 * lat[len(lat) // 2], 2),
                "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
                "queries_per_s": round(n * rounds * queries / wall, 1),
                "service_rss_mb": round(rss_mb(pid), 1),
                "worker_rss_mb": round(statistics.mean(r["rss_mb"] for r in results), 1),
                "hits_per_query": round(sum(r["hits"] for r in results)
                                        / (n * rounds * queries), 2)}
        report["index_calls"] = ServiceClient(service.url).health()["index_calls"]
    finally:
        service.close()
        tmp.cleanup()
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--queries", type=int, default=64, help="per worker per turn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", choices=("batch", "single"), default="batch")
    ap.add_argument("--out", default=None, help="keep the corpus and index here (reused)")
    a = ap.parse_args(argv)
    r = run(a.passages, a.workers, a.queries, a.rounds, a.mode, a.out)
    for key in ("w1", f"w{a.workers}"):
        x = r[key]
        print(f"{key}: p50 {x['p50_ms']} ms, p99 {x['p99_ms']} ms per request, "
              f"{x['queries_per_s']} queries/s; service {x['service_rss_mb']} MB, "
              f"worker {x['worker_rss_mb']} MB")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
