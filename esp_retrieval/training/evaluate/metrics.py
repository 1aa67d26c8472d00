"""Benchmark-only metrics of the ESP evaluation: entity matching, neighbour agreement, conflict,
effective rank and fronts.

The IR and clustering metrics (NDCG@k, P@k, macro-F1, purity, NMI, ARI) live in
:mod:`esp_retrieval.subspace.metrics`, the one copy that training, the evaluation and the service share.
Pure numpy (plus scipy for tau-b), no torch. Fronts maximise every coordinate; the
hypervolume reference point is given explicitly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from functools import lru_cache
from urllib.parse import unquote

import numpy as np

__all__ = [
    "effective_rank",
    "entity_mentioned",
    "hypervolume_2d",
    "intent_agreement_at_k",
    "kendall_tau",
    "pareto_front",
    "wikipedia_title",
]


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


# ---------------------------------------------------------------- neighbours


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
