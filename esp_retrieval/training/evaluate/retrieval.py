"""Score held-out queries exactly as the service does, and turn rankings into benchmark metrics.

Every ranking goes through the service's engine: block-normalised embeddings, weights resolved
by :mod:`esp_retrieval.subspace.weights`, the exact float64 top k of the numpy backend with ties to the lower
row (:func:`esp_retrieval.training.heldout.engine_topk`). Metrics are :mod:`esp_retrieval.subspace.metrics`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.metrics import ndcg_at_k, precision_at_k
from esp_retrieval.subspace.scoring import normalize_blocks, subspace_scores
from esp_retrieval.subspace.weights import WeightsInput, resolve_block_weights
from esp_retrieval.training.evaluate.benchmark import DLBench
from esp_retrieval.training.evaluate.metrics import kendall_tau
from esp_retrieval.training.heldout import engine_topk

K_EVAL = 10


def search(
    queries: np.ndarray, corpus: np.ndarray, layout: SubspaceLayout, weights: WeightsInput | None, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` ``(scores, rows)`` of block-normalised ``queries (nq, D)`` in ``corpus (N, D)``,
    ranked by the service's engine."""
    return engine_topk(queries, corpus, layout, resolve_block_weights(weights, layout), k)


@dataclass(frozen=True)
class RetrievalScores:
    """Mean metrics over held-out queries, and the per-query values they average."""

    ndcg: float
    entity_p: float
    per_query_ndcg: dict[str, float]
    per_query_entity_p: dict[str, float]


def score_dl(
    bench: DLBench,
    corpus: np.ndarray,
    queries: Mapping[str, np.ndarray],
    layout: SubspaceLayout,
    *,
    weights: WeightsInput | None,
    year: str,
    k: int = K_EVAL,
    sparse: Mapping[str, np.ndarray] | None = None,
) -> RetrievalScores:
    """NDCG@k (all judged queries of ``year``) and entity precision@k (those with gold entities).

    ``queries``: qid -> block-normalised ``(D,)`` embedding for at least the queries of ``year``.
    """
    return score_dl_sweep(bench, corpus, queries, layout, sweep=[weights], year=year, k=k, sparse=sparse)[0]


def score_dl_sweep(
    bench: DLBench,
    corpus: np.ndarray,
    queries: Mapping[str, np.ndarray],
    layout: SubspaceLayout,
    *,
    sweep: Sequence[WeightsInput | None],
    year: str,
    k: int = K_EVAL,
    sparse: Mapping[str, np.ndarray] | None = None,
) -> list[RetrievalScores]:
    """:func:`score_dl` at every weight vector of ``sweep``, in one engine call: the queries are
    repeated once per weight vector, each copy with its own row weights (the engine's per-row
    weights), so the corpus is scanned once per batch instead of once per weight vector.

    ``sparse``: sparse blocks (:mod:`esp_retrieval.subspace.sparse`) scored beside the dense ones, name ->
    ``(nq, N)`` block scores of the year's queries in order; their weights are keys of the sweep's
    weight dicts (default 1). Then the ranking is :func:`_sweep_rows_with_sparse`'s exact sum."""
    if not sweep:
        return []
    qids = list(bench.queries[year])
    q = np.stack([queries[x] for x in qids]).astype(corpus.dtype)
    if sparse:
        rows_all = _sweep_rows_with_sparse(q, corpus, layout, sweep=sweep, sparse=sparse, k=k)
    else:
        w = np.stack([resolve_block_weights(s, layout) for s in sweep])  # (P, K)
        rows_all = []
        step = max(1, 4096 // max(1, len(qids)))  # weight vectors per call: bounded score workspace
        for a in range(0, len(sweep), step):
            ws = w[a : a + step]
            rep = np.repeat(ws, len(qids), axis=0)
            _, rows = engine_topk(np.tile(q, (len(ws), 1)), corpus, layout, rep, k)
            rows_all.extend(np.split(rows, len(ws)))
    out = []
    for rows in rows_all:
        ndcg, ent = {}, {}
        for qid, r in zip(qids, rows, strict=True):
            ndcg[qid] = ndcg_at_k([bench.pids[i] for i in r], bench.qrels[year].get(qid, {}), k)
            if bench.entities.get(qid):
                ent[qid] = precision_at_k([bench.mentions(qid, int(i)) for i in r], k)
        out.append(RetrievalScores(
            float(np.mean(list(ndcg.values()))), float(np.mean(list(ent.values()))) if ent else math.nan,
            ndcg, ent))
    return out


def _sweep_rows_with_sparse(q: np.ndarray, corpus: np.ndarray, layout: SubspaceLayout, *,
                            sweep: Sequence[WeightsInput | None], sparse: Mapping[str, np.ndarray],
                            k: int) -> list[np.ndarray]:
    """Top-``k`` rows per sweep point of ``sum_k w_k cos(q_k, d_k) + sum_s w_s sparse_s(q, d)``,
    exact in float64 over every row (ties to the lower row, as the engine): the per-block cosines
    ``(K, nq, N)`` are computed once, each point is a weighted sum of them."""
    q64, c64 = q.astype(np.float64), corpus.astype(np.float64)
    blocks = np.stack([q64[:, o.offset : o.end] @ c64[:, o.offset : o.end].T for o in layout.objectives])
    extra = np.stack([np.asarray(s, dtype=np.float64) for s in sparse.values()])
    names = list(sparse)
    out = []
    for point in sweep:
        if point is not None and not isinstance(point, Mapping):
            raise ValueError("with a sparse block, sweep weights are name -> weight mappings")
        given = dict(point or {})
        unknown = sorted(set(given) - set(layout.names) - set(names))
        if unknown:
            raise ValueError(f"sweep weights name {unknown}; allowed: {[*layout.names, *names]}")
        w_sparse = np.array([float(given.pop(n, 1.0)) for n in names])
        # a point may put all its weight on a sparse block: the dense weights alone may all be 0
        default = layout.default_weights()
        w = np.array([float(given.get(n, default[i])) for i, n in enumerate(layout.names)])
        total = np.tensordot(w, blocks, axes=1) + np.tensordot(w_sparse, extra, axes=1)
        out.append(_topk_rows(total, k))
    return out


def _topk_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """``(nq, k)`` rows of the ``k`` best ``scores (nq, N)`` per query, score descending, ties to
    the lower row: every row tied with the ``k``-th score is a candidate, then an exact sort."""
    k = min(k, scores.shape[1])
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    out = np.empty((scores.shape[0], k), dtype=np.int64)
    for i, row in enumerate(scores):
        cand = np.flatnonzero(row >= kth[i])
        out[i] = cand[np.lexsort((cand, -row[cand]))][:k]
    return out


def simplex_grid(names: Sequence[str], step: float) -> list[dict[str, float]]:
    """Every weight vector on the simplex with coordinates in multiples of ``step`` (sum 1)."""
    n = round(1 / step)
    if not math.isclose(n * step, 1.0, abs_tol=1e-9) or n < 1:
        raise ValueError(f"step must divide 1 (e.g. 0.1, 0.25), got {step}")
    out = []
    for combo in itertools.product(range(n + 1), repeat=len(names)):
        if sum(combo) == n:
            out.append({name: round(c / n, 10) for name, c in zip(names, combo, strict=True)})
    return out


def ranking_conflict(
    bench: DLBench,
    corpus: np.ndarray,
    queries: Mapping[str, np.ndarray],
    layout: SubspaceLayout,
    *,
    first: str,
    second: str,
    qids: Sequence[str],
) -> float:
    """Mean over ``qids`` of Kendall tau-b between the ``first``- and ``second``-block cosines of
    the query's candidate pool (per-block scores as :func:`esp_retrieval.subspace.scoring.subspace_scores`
    reports them). ``epsilon = 1 - tau`` is the conflict proxy."""
    a, b = layout.index(first), layout.index(second)
    taus = []
    for qid in qids:
        rows = np.asarray([bench.row[p] for p in bench.pool.get(qid, [])], dtype=np.int64)
        if rows.size < 2:
            continue
        per = subspace_scores(queries[qid][None, :].astype(corpus.dtype), corpus, rows[None, :], layout)[0]
        t = kendall_tau(per[:, a], per[:, b])
        if not math.isnan(t):
            taus.append(t)
    return float(np.mean(taus)) if taus else math.nan


def label_conflict(bench: DLBench, year: str) -> float:
    """The data's own conflict: mean Kendall tau-b, over queries with gold entities, between the
    NIST grade and "mentions the gold entity" (0/1) across the query's judged pool passages."""
    taus = []
    for qid in bench.entity_qids(year):
        judged = [(p, g) for p, g in bench.qrels[year].get(qid, {}).items() if p in bench.row]
        if len(judged) < 2:
            continue
        grades = [g for _, g in judged]
        ment = [float(bench.mentions(qid, bench.row[p])) for p, _ in judged]
        t = kendall_tau(grades, ment)
        if not math.isnan(t):
            taus.append(t)
    return float(np.mean(taus)) if taus else math.nan


def neighbours(
    emb: np.ndarray, layout: SubspaceLayout, weights: WeightsInput | None, rows: Sequence[int], k: int
) -> np.ndarray:
    """``(len(rows), k)`` nearest other items of ``emb`` for each of ``rows`` (self excluded)."""
    e = normalize_blocks(emb, layout)
    _, idx = search(e[np.asarray(rows)], e, layout, weights, k + 1)
    out = np.empty((len(rows), k), dtype=np.int64)
    for i, (r, cand) in enumerate(zip(rows, idx, strict=True)):
        out[i] = [c for c in cand if c != r][:k]
    return out
