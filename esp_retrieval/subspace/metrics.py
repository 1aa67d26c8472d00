"""IR and clustering metrics, one copy for training, evaluation and the service (no torch).

Where scikit-learn computes what the reports mean, it is used (macro-F1, NMI, ARI); our own
code remains only where a library's definition differs:

- NDCG@k matches trec_eval's ``ndcg_cut_k``, not ``sklearn.metrics.ndcg_score``: gain = the
  graded label itself (linear, *not* ``2^rel - 1``), discount ``1 / log2(rank + 1)``, the ideal
  ranking built from **every** judged document of the query (so relevant passages missing from
  a closed corpus lower the score, as in trec_eval); sklearn scores a score vector and builds
  the ideal from the ranked items only. Documents without a judgement, or with a negative
  grade, have gain 0.
- Precision@k divides by ``k`` even when fewer than ``k`` documents were ranked (trec_eval's P_k).
- Purity (no library function): share of clustered items whose cluster's majority class is
  their own. Noise (HDBSCAN's -1) is left out of purity; NMI and ARI count each noise item as
  a singleton cluster.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

__all__ = [
    "adjusted_rand",
    "dcg",
    "macro_f1",
    "ndcg_at_k",
    "normalized_mutual_info",
    "precision_at_k",
    "purity",
]

Labels = Sequence[int] | np.ndarray


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


# ---------------------------------------------------------------- classification


def macro_f1(y_true: Sequence[Hashable], y_pred: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Unweighted mean of per-class F1 over ``labels`` (``sklearn.metrics.f1_score``,
    ``average="macro"``); a class with no support and no prediction scores 0
    (``zero_division=0``), and so does an empty ``y_true``."""
    from sklearn.metrics import f1_score

    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} items, y_pred {len(y_pred)}")
    if not len(labels):
        raise ValueError("labels must name at least one class")
    if not len(y_true):
        return 0.0
    return float(f1_score(list(y_true), list(y_pred), labels=list(labels), average="macro", zero_division=0))


# ---------------------------------------------------------------- clusters


def purity(classes: Sequence[Hashable], clusters: Labels, noise: int | None = -1, min_size: int = 1) -> float:
    """Share of items whose cluster's majority class is their own class.

    Items in the ``noise`` cluster (HDBSCAN's -1) are left out, and so are clusters of fewer
    than ``min_size`` items (a singleton is pure by construction: ``min_size=2`` measures only
    the groupings a clustering made); NaN when nothing is left. Classes are compared as strings.
    One contingency table, so many clusters cost no per-cluster pass.
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
    _, cl = np.unique(k[mask], return_inverse=True)
    _, cls = np.unique(c[mask].astype(str), return_inverse=True)
    table = np.zeros((int(cl.max()) + 1, int(cls.max()) + 1), dtype=np.int64)
    np.add.at(table, (cl, cls), 1)
    return int(table.max(axis=1).sum()) / int(mask.sum())


def _noise_as_singletons(clusters: Labels, noise: int | None) -> np.ndarray:
    k = np.asarray(clusters).astype(np.int64).copy()
    if noise is not None:
        where = np.nonzero(k == noise)[0]
        k[where] = k.max(initial=0) + 1 + np.arange(where.size)
    return k


def normalized_mutual_info(classes: Sequence[Hashable], clusters: Labels, noise: int | None = -1) -> float:
    """sklearn NMI (arithmetic mean normalisation); noise items become singleton clusters."""
    from sklearn.metrics import normalized_mutual_info_score

    return float(
        normalized_mutual_info_score(np.asarray(classes, dtype=str), _noise_as_singletons(clusters, noise))
    )


def adjusted_rand(classes: Sequence[Hashable], clusters: Labels, noise: int | None = -1) -> float:
    """sklearn ARI; noise items become singleton clusters."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(np.asarray(classes, dtype=str), _noise_as_singletons(clusters, noise)))
