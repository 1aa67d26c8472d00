"""The BM25 + zero-shot anchor: bm25s is Lucene's BM25, fusion is per query."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esp_retrieval.training.evaluate.hybrid import BM25Scorer, alpha_grid, best_alpha, minmax_lists, rrf_lists

DOCS = ["the cat sat on the mat", "a dog chased the cat", "dogs and cats and dogs", "stock market news"]


def _lucene_bm25(query: list[str], docs: list[list[str]], k1: float, b: float) -> np.ndarray:
    """Lucene's BM25 written out: idf = ln(1 + (N - df + 0.5) / (df + 0.5)) times the saturated,
    length-normalised tf (Lucene 8+ drops the constant (k1 + 1) factor: same ranking)."""
    n = len(docs)
    avgdl = sum(map(len, docs)) / n
    out = np.zeros(n)
    for t in query:
        df = sum(t in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for j, d in enumerate(docs):
            tf = d.count(t)
            out[j] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return out


def test_bm25_scores_are_lucene_bm25() -> None:
    # no stop words here: the hand count must see the same tokens as bm25s (lower case, 2+ chars)
    scorer = BM25Scorer(k1=0.9, b=0.4, stopwords=None)
    got = scorer.scores(DOCS, ["cat dogs", "the market", "unknown words"])
    toks = [[w for w in d.split() if len(w) > 1] for d in DOCS]
    for i, q in enumerate([["cat", "dogs"], ["the", "market"]]):
        np.testing.assert_allclose(got[i], _lucene_bm25(q, toks, 0.9, 0.4), rtol=1e-5)
    assert not got[2].any()  # no indexed term: scores 0, no error


def test_stop_words_are_dropped() -> None:
    got = BM25Scorer(stopwords="en").scores(DOCS, ["the"])
    assert not got.any()


def test_minmax_lists_scale_each_querys_top_depth() -> None:
    s = np.array([[3.0, 1.0, 2.0, 0.5], [1.0, 1.0, 1.0, 1.0]])
    out = minmax_lists(s, depth=3)
    np.testing.assert_allclose(out[0], [1.0, 0.0, 0.5, 0.0])  # row 3 is outside the top 3: 0
    assert out[1].max() == 1.0 and np.count_nonzero(out[1]) == 3  # constant list: all 1 (ties to lower rows)
    np.testing.assert_allclose(minmax_lists(s, depth=4)[0], [1.0, 0.2, 0.6, 0.0])


def test_rrf_lists_are_reciprocal_ranks() -> None:
    out = rrf_lists(np.array([[0.1, 0.9, 0.5]]), depth=2, k=60)
    np.testing.assert_allclose(out[0], [0.0, 1 / 61, 1 / 62])


def test_alpha_grid_and_best_alpha() -> None:
    assert alpha_grid(0.25) == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="alpha_step"):
        alpha_grid(0.3)
    sweep = [{"weights": {"bm25": a, "dense": 1 - a}, "ndcg": {"q": v}, "entity_p": {}}
             for a, v in [(0.0, 0.5), (0.5, 0.7), (1.0, 0.7)]]
    assert best_alpha(sweep) == 0.5  # ties: the smaller alpha
