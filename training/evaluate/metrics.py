"""Offline metrics of the ESP benchmark: ranking, classification, conflict, fronts, clusters.

Pure numpy (plus scipy/sklearn for tau-b, NMI and ARI), no torch. Conventions:

- NDCG@k matches trec_eval's ``ndcg_cut_k``: gain = the graded label itself (linear, *not*
  ``2^rel - 1``), discount ``1 / log2(rank + 1)``, the ideal ranking built from **every** judged
  document of the query (so relevant passages missing from a closed corpus lower the score,
  as in trec_eval). Documents without a judgement have gain 0.
- Precision@k divides by ``k`` even when fewer than ``k`` documents were ranked (trec_eval's P_k).
- Fronts maximise every coordinate; the hypervolume reference point is given explicitly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Mapping, Sequence
from functools import lru_cache
from urllib.parse import unquote

import numpy as np

__all__ = [
    "adjusted_rand",
    "dcg",
    "effective_rank",
    "entity_mentioned",
    "hypervolume_2d",
    "intent_agreement_at_k",
    "kendall_tau",
    "macro_f1",
    "ndcg_at_k",
    "normalized_mutual_info",
    "pareto_front",
    "precision_at_k",
    "purity",
    "wikipedia_title",
]


# ---------------------------------------------------------------- ranking


def dcg(gains: Sequence[float]) -> float:
    """``sum_i gains[i] / log2(i + 2)`` (rank 1 has discount 1)."""
    g = np.asarray(gains, dtype=np.float64)
    if g.size == 0:
        return 0.0
    return float(np.sum(g / np.log2(np.arange(2, g.size + 2))))


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """trec_eval ``ndcg_cut_k`` of one ranked list against graded ``qrels`` ``{doc: grade}``.

    Returns 0.0 for a query without any positive judgement (trec_eval does the same).
    """
    if k <= 0:
        raise ValueError(f"k must be >= 1, got {k}")
    gains = [max(int(qrels.get(d, 0)), 0) for d in list(ranked)[:k]]
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = dcg(ideal)
    return dcg(gains) / idcg if idcg > 0 else 0.0


def precision_at_k(hits: Sequence[bool], k: int = 10) -> float:
    """Share of the first ``k`` ranks that are hits; missing ranks count as misses."""
    if k <= 0:
        raise ValueError(f"k must be >= 1, got {k}")
    return float(sum(bool(h) for h in list(hits)[:k])) / k


# ---------------------------------------------------------------- entities


def wikipedia_title(url: str) -> str:
    """``https://en.wikipedia.org/wiki/Wi-Fi_(band)`` -> ``"wi-fi"``.

    Last path segment, percent-decoded, underscores to spaces, a trailing parenthetical
    disambiguation removed, lower-cased.
    """
    seg = unquote(url.rstrip("/").rsplit("/", 1)[-1]).replace("_", " ")
    seg = re.sub(r"\s*\([^)]*\)\s*$", "", seg)
    return seg.strip().lower()


@lru_cache(maxsize=4096)
def _mention_pattern(term: str) -> re.Pattern[str]:
    # Whole-word, case-insensitive: "space" must not match "workspace".
    return re.compile(r"(?<!\w)" + re.escape(term.strip().lower()) + r"(?!\w)")


def entity_mentioned(text: str, names: Sequence[str]) -> bool:
    """True when ``text`` mentions any of ``names`` as a whole word, case-insensitively."""
    low = text.lower()
    return any(n.strip() and _mention_pattern(n.strip().lower()).search(low) for n in names)


# ---------------------------------------------------------------- classification


def macro_f1(y_true: Sequence[Hashable], y_pred: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Unweighted mean of per-class F1 over ``labels``; a class with no support and no
    prediction scores 0 (sklearn's ``zero_division=0``)."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} items, y_pred {len(y_pred)}")
    if not labels:
        raise ValueError("labels must name at least one class")
    t = np.asarray(y_true, dtype=object)
    p = np.asarray(y_pred, dtype=object)
    scores = []
    for c in labels:
        tp = float(np.sum((t == c) & (p == c)))
        fp = float(np.sum((t != c) & (p == c)))
        fn = float(np.sum((t == c) & (p != c)))
        denom = 2 * tp + fp + fn
        scores.append(2 * tp / denom if denom > 0 else 0.0)
    return float(np.mean(scores))


def intent_agreement_at_k(labels: Sequence[Hashable], neighbours: np.ndarray, rows: Sequence[int]) -> float:
    """Mean share of each query's ``k`` retrieved neighbours that carry its own label.

    ``labels``: one per item of the pool; ``neighbours``: ``(len(rows), k)`` pool indices of the
    neighbours of pool item ``rows[i]`` (the item itself excluded by the caller).
    """
    lab = np.asarray(labels, dtype=object)
    nb = np.asarray(neighbours)
    if nb.ndim != 2 or nb.shape[0] != len(rows):
        raise ValueError(f"neighbours must be (len(rows)={len(rows)}, k), got {nb.shape}")
    same = lab[nb] == lab[np.asarray(rows)][:, None]
    return float(same.mean())


# ---------------------------------------------------------------- conflict and geometry


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties accounted for); NaN when either side is constant."""
    from scipy.stats import kendalltau

    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got {xa.shape} and {ya.shape}")
    if xa.size < 2 or np.all(xa == xa[0]) or np.all(ya == ya[0]):
        return math.nan
    return float(kendalltau(xa, ya, variant="b").statistic)


def effective_rank(x: np.ndarray) -> float:
    """Roy & Vetterli (2007): ``exp(H(p))`` with ``p = s / sum(s)`` over the singular values of
    ``x`` ``(n, d)``. Between 1 (rank one) and ``min(n, d)`` (flat spectrum). Not centred."""
    s = np.linalg.svd(np.asarray(x, dtype=np.float64), compute_uv=False)
    s = s[s > 0]
    if s.size == 0:
        return 0.0
    p = s / s.sum()
    return float(np.exp(-np.sum(p * np.log(p))))


# ---------------------------------------------------------------- fronts


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of ``points (n, m)`` (maximise every column), sorted
    by the first column ascending. Duplicates of a front point are all kept."""
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"points must be (n, m), got shape {p.shape}")
    keep = []
    for i in range(p.shape[0]):
        ge = np.all(p >= p[i], axis=1)
        gt = np.any(p > p[i], axis=1)
        if not np.any(ge & gt):
            keep.append(i)
    idx = np.asarray(keep, dtype=np.int64)
    return idx[np.lexsort((-p[idx, 1], p[idx, 0]))] if idx.size else idx


def hypervolume_2d(points: np.ndarray, ref: tuple[float, float] = (0.0, 0.0)) -> float:
    """Area dominated by ``points (n, 2)`` (maximisation) and bounded below by ``ref``.

    Points not strictly better than ``ref`` in both coordinates contribute nothing.
    """
    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    p = p[(p[:, 0] > ref[0]) & (p[:, 1] > ref[1])]
    if p.size == 0:
        return 0.0
    p = p[pareto_front(p)]
    order = np.argsort(-p[:, 0])  # x descending -> y ascending along the front
    area, y_prev = 0.0, ref[1]
    for x, y in p[order]:
        if y > y_prev:
            area += (x - ref[0]) * (y - y_prev)
            y_prev = y
    return float(area)


# ---------------------------------------------------------------- clusters


def purity(
    classes: Sequence[Hashable],
    clusters: Sequence[int] | np.ndarray,
    noise: int | None = -1,
    min_size: int = 1,
) -> float:
    """Share of items whose cluster's majority class is their own class.

    Items in the ``noise`` cluster (HDBSCAN's -1) are left out, and so are clusters of fewer
    than ``min_size`` items (a singleton is pure by construction: ``min_size=2`` measures only
    the groupings a clustering made); NaN when nothing is left.
    """
    c = np.asarray(classes, dtype=object)
    k = np.asarray(clusters)
    if c.shape != k.shape:
        raise ValueError(f"classes and clusters differ in length: {c.shape} vs {k.shape}")
    mask = np.ones(k.shape, dtype=bool) if noise is None else k != noise
    if min_size > 1:
        ids, sizes = np.unique(k[mask], return_counts=True)
        mask &= np.isin(k, ids[sizes >= min_size])
    if not mask.any():
        return math.nan
    total = 0
    for cl in np.unique(k[mask]):
        _, counts = np.unique(c[mask & (k == cl)].astype(str), return_counts=True)
        total += int(counts.max())
    return total / int(mask.sum())


def _noise_as_singletons(clusters: Sequence[int] | np.ndarray, noise: int | None) -> np.ndarray:
    k = np.asarray(clusters).astype(np.int64).copy()
    if noise is not None:
        where = np.nonzero(k == noise)[0]
        k[where] = k.max(initial=0) + 1 + np.arange(where.size)
    return k


def normalized_mutual_info(
    classes: Sequence[Hashable], clusters: Sequence[int] | np.ndarray, noise: int | None = -1
) -> float:
    """sklearn NMI (arithmetic mean normalisation); noise items become singleton clusters."""
    from sklearn.metrics import normalized_mutual_info_score

    return float(
        normalized_mutual_info_score(np.asarray(classes, dtype=str), _noise_as_singletons(clusters, noise))
    )


def adjusted_rand(
    classes: Sequence[Hashable], clusters: Sequence[int] | np.ndarray, noise: int | None = -1
) -> float:
    """sklearn ARI; noise items become singleton clusters."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(np.asarray(classes, dtype=str), _noise_as_singletons(clusters, noise)))
