"""The steps of the one refine loop every backend runs (:meth:`subspace.engine.base.Backend.search`).

docs/architecture.md section 1: ``score(q, d) = <concat_k(w_k q_k), d>``, so a batch is scored
by block-*scaled* queries against the unchanged corpus. Each step is written once, over an
array module ``xp`` (numpy on the host, cupy on a device; torch and faiss convert at their
scan), so a device backend keeps the corpus, the work and the candidates on the device:

1. :func:`scale`: the block-scaled queries (float64 for the re-rank; float32, divided per row
   by ``max_k w_k |q_k|``, for the scan) and per query the bound ``sum_k w_k |q_k| max|d_k|``
   that the scan's roundoff ``eps`` scales with;
2. the backend's scan (its only part): the top ``c`` candidates by scan score ``s'``, and
   :func:`scan_bound`, the highest scan score a row outside them can have;
3. :func:`complete`: if that bound is below ``s'_(k) - 2 eps`` no row outside the candidates can
   reach the exact top ``k`` (``|s' - s| <= eps``); otherwise the query is rescanned with ``4c``;
   :func:`prune` drops candidates below ``s'_(k) - 2 eps`` before the costly re-rank;
4. :func:`exact_scores` and :func:`rank`: candidates re-scored in float64 from the master (or
   from vectors fetched with them, :class:`RowTable`), ordered by (score desc, row asc).

**Sparse blocks** (:mod:`esp_retrieval.subspace.engine.sparse_terms`: a BM25 block ``w_s <q_s, d_s>``, its
weight one more ``w_k``) are one more exact term without a change to the loop: their queries
and weights are :attr:`Batch.sparse` (checked by the backend, stored by :func:`scale`, the one
place queries are scaled, carried to rescans by ``take``); their reach
``sum_s w_s sum_t |q_t| max|d_t|`` is part of :attr:`Batch.bound` and of the scan factor; a
scan adds their float32 scores to its dense ones
(:class:`~esp_retrieval.subspace.engine.sparse_terms.SparseScan`, given to ``_scan``, ``_scan_masked`` and
``_scan_rows`` as ``sparse``), whose per-query rounding ``Backend._eps`` adds to ``eps``, so
:func:`complete` and :func:`prune` stay valid as they are; ``Backend._exact_scores`` adds their
float64 weighted dot to the dense one. A row whose dense score is 0 still enters through its
sparse score: the scan ranks the sum. A backend whose scan cannot add them declares
``Capabilities(sparse=False)`` and refuses a sparse search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from esp_retrieval.subspace.engine.sparse_terms import SparseBatch

Array = Any  # an array of the search's module (numpy.ndarray, cupy.ndarray)
_NO_ROW = np.iinfo(np.int64).max  # sort key of padding: after every row


class Batch(NamedTuple):
    """The queries of one search (or of its pending part), as the scan and the re-rank read them."""

    queries: Array  # (m, D) float32 block-normalised, unscaled (per-subspace scores)
    scaled64: Array  # (m, D) float64 block-scaled (the exact re-rank)
    scan: Array  # (m, D) float32 block-scaled times ``factor``: what a scan multiplies
    factor: Array  # (m,) float64 > 0: scan scores are ``factor`` times the scores
    bound: Array  # (m,) float64 ``sum_k w_k |q_k| max|d_k|``: no score exceeds it
    k: int  # hits wanted per query (``min(k, allowed rows)`` when that is known)
    sparse: SparseBatch | None = None  # the sparse blocks' queries and weights (host); ``None``: none

    def take(self, sel: Any) -> Batch:
        sparse = None if self.sparse is None else self.sparse.take(sel)
        return Batch(
            self.queries[sel],
            self.scaled64[sel],
            self.scan[sel],
            self.factor[sel],
            self.bound[sel],
            self.k,
            sparse,
        )


class Candidates(NamedTuple):
    """What a scan (or a candidate generator) hands the refine loop, ``(m, M)``, ``-1`` = none."""

    rows: Array  # int64 row ids
    #: float32 scan scores in the units of ``Batch.scan``, sorted descending; ``None``: no scan
    #: order to prune by (every candidate is re-ranked)
    scores: Array = None
    #: ``(m,)`` float64: no row outside ``rows`` has a higher scan score (``-inf``: none is
    #: outside); ``None``: the generator vouches for its candidates (an exhaustive list, or an
    #: approximate index whose own stop rule decided), so they are not completed
    bound: Array = None
    #: what the re-rank reads candidate vectors from (``None``: the master corpus)
    source: Any = None


class Filter(NamedTuple):
    """An ``allowed`` argument as the loop uses it."""

    n_allowed: int | None  # allowed rows; ``None``: unknown (a store that filters itself)
    rows: np.ndarray | None = None  # their indices, ascending (host); ``None``: every row
    mask: np.ndarray | None = None  # ``(N,)`` bool on the host; ``None``: no row mask
    arg: Any = None  # what the backend's candidates take: a device mask, an expression


class RowTable:
    """Vectors of candidate rows fetched with them, indexed by row id like the master.

    For a store whose rows are not all in the master (documents written live)."""

    def __init__(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        order = np.argsort(rows, kind="stable")
        self._keys = np.asarray(rows, np.int64)[order]
        self._vectors = np.asarray(vectors, np.float64)[order]

    def __getitem__(self, rows: Any) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        if len(self._keys) == 0:
            return np.zeros((*rows.shape, self._vectors.shape[1]))
        pos = np.minimum(np.searchsorted(self._keys, rows), len(self._keys) - 1)
        return self._vectors[pos]  # an unknown row (padding) reads some vector: masked by the caller


def scale(
    xp: ModuleType,
    q: Array,
    w: Array,
    *,
    block_of: Array,
    indicator: Array,
    max_norm: Array,
    k: int,
    sparse: SparseBatch | None = None,
) -> Batch:
    """:class:`Batch` of queries ``q`` ``(m, D)`` float32 and weights ``w`` ``(m, K)`` float64
    (``block_of``: each column's block; ``indicator``: ``(D, K)`` float64; ``max_norm``: ``(K,)``),
    and of the sparse blocks' queries ``sparse``.

    The scan's queries are divided per row by ``max_k w_k |q_k|`` (and the sparse blocks'
    ``w_s reach_s``): a positive factor changes no ranking and keeps every scaled value within
    ``[-1, 1]``, so a float16 query neither overflows nor flushes its largest block to zero.
    """
    q64 = q.astype(xp.float64)
    scaled64 = q64 * w[:, block_of]
    bnorm = w * xp.sqrt((q64 * q64) @ indicator)  # (m, K): w_k |q_k|
    top = bnorm.max(axis=1)
    bound = bnorm @ max_norm
    if sparse is not None:
        reach = xp.asarray(sparse.weights * sparse.reach)  # (m, S): w_s sum_t |q_t| max|d_t|
        top = xp.maximum(top, reach.max(axis=1))
        bound = bound + reach.sum(axis=1)
    factor = 1.0 / xp.where(top > 0, top, 1.0)
    scan = (scaled64 * factor[:, None]).astype(xp.float32)
    return Batch(q, scaled64, scan, factor, bound, k, sparse)


def scan_bound(xp: ModuleType, rows: Array, scores: Array, c: int) -> Array:
    """The bound of a top-``c`` scan: its ``c``-th score, ``-inf`` where it found fewer than ``c``
    rows (a scan returns fewer only when fewer rows are there to find)."""
    if scores.shape[1] < c:
        return xp.full(scores.shape[0], -xp.inf)
    found = (rows >= 0).sum(axis=1)
    return xp.where(found < c, -xp.inf, scores[:, c - 1].astype(xp.float64))


def complete(xp: ModuleType, scores: Array, bound: Array, k: int, eps: Array) -> Array:
    """Per query: can no row outside the candidates reach the exact top ``k``?"""
    if scores.shape[1] < k:
        return bound == -xp.inf
    kth = scores[:, k - 1].astype(xp.float64)
    return (bound < kth - 2.0 * eps) | (bound == -xp.inf)


def prune(xp: ModuleType, rows: Array, scores: Array, k: int, eps: Array, *, trim: bool) -> Array:
    """Drop candidates that cannot be in the top ``k`` (they become ``-1``).

    The ``k`` best candidates all score at least ``s'_(k) - eps``, so the exact ``k``-th score
    does too; a row with ``s' < s'_(k) - 2 eps`` scores below ``s'_(k) - eps``: out. ``scores``
    are sorted descending, so the dropped rows are a tail; ``trim`` cuts it off (on the host,
    where the width is free to learn; a device would wait for it).
    """
    if scores.shape[1] <= k:
        return rows
    cut = scores[:, k - 1].astype(xp.float64) - 2.0 * eps
    keep = scores.astype(xp.float64) >= cut[:, None]
    keep[:, :k] = True
    out = xp.where(keep, rows, -1)
    if trim:
        out = out[:, : max(k, int(keep.sum(axis=1).max()))]
    return out


def exact_scores(
    xp: ModuleType, gather: Callable[[Any], Any], scaled64: Array, rows: Array, elements: int
) -> Array:
    """Float64 scores ``<scaled64[i], gather(rows[i, j])>`` of candidate ``rows`` ``(m, M)``
    (``-1`` = none: ``-inf``). ``gather(idx)`` returns rows ``idx`` in float64; it is asked for
    about ``elements`` values at a time (tiles of queries x candidates), so the gathered block
    stays bounded."""
    nq, m = rows.shape
    dim = scaled64.shape[1]
    exact = xp.full((nq, m), -xp.inf, dtype=xp.float64)
    cols = max(1, min(m, elements // dim))
    step = max(1, elements // (dim * cols))
    for q0 in range(0, nq, step):
        q1 = min(nq, q0 + step)
        for c0 in range(0, m, cols):
            c1 = min(m, c0 + cols)
            r = rows[q0:q1, c0:c1]
            valid = r >= 0
            hits = gather(xp.where(valid, r, 0).reshape(-1)).reshape(q1 - q0, c1 - c0, dim)
            s = xp.matmul(hits, scaled64[q0:q1, :, None])[..., 0]
            exact[q0:q1, c0:c1] = xp.where(valid, s, -xp.inf)
    return exact


def rank(
    xp: ModuleType, exact: Array, rows: Array, k: int, stable_argsort: Callable[[Array], Array]
) -> tuple[Array, Array]:
    """The top ``k`` of candidates by (exact score desc, row asc): ``(rows, scores float32)``,
    ``(m, k)``, padded with row ``-1`` (score ``-inf``) where there are fewer candidates."""
    if rows.shape[1] < k:
        pad = k - rows.shape[1]
        rows = xp.concatenate([rows, xp.full((rows.shape[0], pad), -1, dtype=rows.dtype)], axis=1)
        exact = xp.concatenate([exact, xp.full((exact.shape[0], pad), -xp.inf)], axis=1)
    # order by row, then a stable sort by score
    by_row = xp.argsort(xp.where(rows >= 0, rows, _NO_ROW), axis=1)
    rows = xp.take_along_axis(rows, by_row, axis=1)
    exact = xp.take_along_axis(exact, by_row, axis=1)
    order = stable_argsort(-exact)[:, :k]
    top = xp.take_along_axis(exact, order, axis=1).astype(xp.float32)
    return xp.take_along_axis(rows, order, axis=1), top


def keep_allowed(
    rows: np.ndarray, scores: np.ndarray, mask: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates ``(m, M)`` (sorted, ``-1`` padding) -> the allowed ones, still sorted, left
    aligned, padded to at least ``k`` columns."""
    keep = (rows >= 0) & mask[np.maximum(rows, 0)]
    width = max(k, int(keep.sum(axis=1).max()) if keep.size else 0)
    order = np.argsort(~keep, axis=1, kind="stable")[:, :width]
    out_rows = np.take_along_axis(np.where(keep, rows, -1), order, 1)
    out_scores = np.take_along_axis(np.where(keep, scores, -np.inf), order, 1)
    if out_rows.shape[1] < width:
        out_rows, out_scores = pad_rows(out_rows, out_scores, width)
    return out_rows, out_scores.astype(np.float32)


def pad_rows(rows: np.ndarray, scores: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad ``(m, M)`` candidates to ``width`` columns: row ``-1``, score ``-inf``."""
    pad = ((0, 0), (0, width - rows.shape[1]))
    return np.pad(rows, pad, constant_values=-1), np.pad(scores, pad, constant_values=-np.inf)


def stack_rows(
    rows: Sequence[np.ndarray], scores: Sequence[np.ndarray], width: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query candidate lists -> ``(m, M)`` arrays sorted by score desc (stable), ``M`` at
    least ``width``, padded with row ``-1`` and score ``-inf``."""
    width = max(width, *(len(r) for r in rows)) if len(rows) else width
    out_rows = np.full((len(rows), width), -1, np.int64)
    out_scores = np.full((len(rows), width), -np.inf, np.float32)
    for i, (r, s) in enumerate(zip(rows, scores, strict=True)):
        o = np.argsort(-s, kind="stable")
        out_rows[i, : len(r)], out_scores[i, : len(r)] = r[o], s[o]
    return out_rows, out_scores
