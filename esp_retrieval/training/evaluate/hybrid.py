"""The anchor users already run: BM25 + the zero-shot trunk, fused per query, untrained.

Weaviate (``relativeScoreFusion``), Qdrant, Milvus, Vespa and Elasticsearch all ship this
hybrid: a BM25 list and a dense list, fused per query by

- **min-max** (convex combination of each list's scores scaled to [0, 1] over its own top
  ``depth``; a passage missing from one list scores 0 there): ``alpha * bm25 + (1 - alpha) * dense``;
- **RRF** (Cormack et al. 2009): ``sum over lists of 1 / (k + rank)``.

BM25 is the ``bm25s`` library (Lucene's BM25 variant, English stop words, no stemming by default),
the dense side the frozen trunk's own normalised mean-pooled embedding: exactly the zero-shot row.
A min-max method sweeps ``alpha`` (its front enters the hypervolume like an ESP sweep); its
single-point row is the *cross-fitted* alpha, chosen on the other held-out year's best NDCG@10,
so no alpha is chosen on the queries it is scored on.

Shapes: ``bm25 (nq, N)`` and ``dense (nq, N)`` full score matrices (97 x 24,884 here: exhaustive
on both sides, so fusion sees exactly each retriever's top ``depth``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from esp_retrieval.subspace.metrics import ndcg_at_k, precision_at_k
from esp_retrieval.training.evaluate.benchmark import DLBench
from esp_retrieval.training.evaluate.retrieval import K_EVAL

#: the weight names of a hybrid's sweep points (``{"bm25": alpha, "dense": 1 - alpha}``)
BM25, DENSE = "bm25", "dense"


@dataclass(frozen=True)
class BM25Scorer:
    """Exhaustive BM25 scores of queries against a fixed corpus (``bm25s``, no stemming)."""

    k1: float = 0.9
    b: float = 0.4
    stopwords: str | None = "en"  # bm25s names: "en"/"english", or None

    def scores(self, corpus: Sequence[str], queries: Sequence[str]) -> np.ndarray:
        """``(len(queries), len(corpus))`` float32 BM25 scores; a query with no indexed term scores 0."""
        import bm25s

        retriever = bm25s.BM25(k1=self.k1, b=self.b)
        retriever.index(bm25s.tokenize(list(corpus), stopwords=self.stopwords, show_progress=False),
                        show_progress=False)
        q_tokens = bm25s.tokenize(list(queries), stopwords=self.stopwords, return_ids=False,
                                  show_progress=False)
        out = np.zeros((len(queries), len(corpus)), dtype=np.float32)
        for i, toks in enumerate(q_tokens):
            known = [t for t in toks if t in retriever.vocab_dict]
            if known:
                out[i] = retriever.get_scores(known)
        return out


def _top(scores: np.ndarray, depth: int) -> np.ndarray:
    """``(nq, depth)`` rows of each query's ``depth`` best scores, best first (ties: lower row)."""
    depth = min(depth, scores.shape[1])
    part = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
    order = np.lexsort((part, -np.take_along_axis(scores, part, axis=1)), axis=1)
    return np.take_along_axis(part, order, axis=1)


def minmax_lists(scores: np.ndarray, depth: int) -> np.ndarray:
    """Each query's top-``depth`` scores min-max scaled to [0, 1]; every other row 0 (a dense
    ``(nq, N)`` matrix, so lists of different retrievers add row by row)."""
    rows = _top(scores, depth)
    vals = np.take_along_axis(scores, rows, axis=1).astype(np.float64)
    lo, hi = vals.min(axis=1, keepdims=True), vals.max(axis=1, keepdims=True)
    scaled = np.where(hi > lo, (vals - lo) / np.where(hi > lo, hi - lo, 1.0), 1.0)
    out = np.zeros(scores.shape, dtype=np.float64)
    np.put_along_axis(out, rows, scaled, axis=1)
    return out


def rrf_lists(scores: np.ndarray, depth: int, k: float) -> np.ndarray:
    """Reciprocal-rank scores ``1 / (k + rank)`` (rank from 1) of each query's top ``depth``."""
    rows = _top(scores, depth)
    out = np.zeros(scores.shape, dtype=np.float64)
    np.put_along_axis(out, rows, 1.0 / (k + np.arange(1, rows.shape[1] + 1, dtype=np.float64))[None, :],
                      axis=1)
    return out


@dataclass(frozen=True)
class FusedMetrics:
    ndcg: dict[str, float]
    entity_p: dict[str, float]


def score_fused(bench: DLBench, year: str, qids: Sequence[str], fused: np.ndarray,
                k: int = K_EVAL) -> FusedMetrics:
    """NDCG@k and entity precision@k of each query's top ``k`` under ``fused (nq, N)``."""
    top = _top(fused, k)
    ndcg: dict[str, float] = {}
    ent: dict[str, float] = {}
    for qid, r in zip(qids, top, strict=True):
        ndcg[qid] = ndcg_at_k([bench.pids[i] for i in r], bench.qrels[year].get(qid, {}), k)
        if bench.entities.get(qid):
            ent[qid] = precision_at_k([bench.mentions(qid, int(i)) for i in r], k)
    return FusedMetrics(ndcg, ent)


def alpha_grid(step: float) -> list[float]:
    n = round(1 / step)
    if n < 1 or not math.isclose(n * step, 1.0, abs_tol=1e-9):
        raise ValueError(f"alpha_step must divide 1 (e.g. 0.05, 0.1), got {step}")
    return [round(i / n, 10) for i in range(n + 1)]


def minmax_sweep(bench: DLBench, year: str, qids: Sequence[str], bm25: np.ndarray, dense: np.ndarray, *,
                 alphas: Sequence[float], depth: int) -> list[dict[str, object]]:
    """The alpha sweep as ESP sweep points: ``{"weights": {bm25, dense}, "ndcg", "entity_p"}``."""
    b, d = minmax_lists(bm25, depth), minmax_lists(dense, depth)
    out: list[dict[str, object]] = []
    for a in alphas:
        m = score_fused(bench, year, qids, a * b + (1.0 - a) * d)
        weights = {BM25: float(a), DENSE: round(1.0 - a, 10)}
        out.append({"weights": weights, "ndcg": m.ndcg, "entity_p": m.entity_p})
    return out


def best_alpha(sweep: Sequence[Mapping[str, object]]) -> float:
    """The alpha of the sweep point with the best mean NDCG@10 (ties: the smaller alpha)."""
    def mean_ndcg(p: Mapping[str, object]) -> float:
        v = p["ndcg"]
        assert isinstance(v, dict)
        return float(np.mean(list(v.values())))

    best = max(range(len(sweep)), key=lambda i: (mean_ndcg(sweep[i]), -i))
    w = sweep[best]["weights"]
    assert isinstance(w, dict)
    return float(w[BM25])
