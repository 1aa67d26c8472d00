"""Exact weighted multi-subspace scoring (docs/architecture.md section 1).

For block-normalised vectors and weights ``w_k >= 0``::

    score(q, d) = sum_k w_k * <q_k, d_k> = < concat_k(w_k * q_k), d >

so one matrix product of block-scaled queries against the unchanged corpus gives the
exact weighted score for a whole batch, even when every row carries its own weights.
Functions here are array-module generic: they use the namespace of their input (numpy
now, cupy on a GPU) and have no per-subspace Python loop.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from esp_retrieval.subspace.layout import SubspaceLayout

Array = Any  # numpy.ndarray or cupy.ndarray


def array_module(x: Array) -> ModuleType:
    """numpy for numpy arrays, cupy for cupy arrays (without importing cupy otherwise)."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy

        return cupy
    return np


def _indicator(layout: SubspaceLayout, xp: ModuleType, dtype: Any) -> Array:
    return xp.asarray(layout.indicator(dtype=np.dtype(dtype)))


def normalize_blocks(
    x: Array, layout: SubspaceLayout, eps: float = 1e-12, *, prescale: bool = False
) -> Array:
    """L2-normalise each block of each row. ``x``: ``(..., D)`` -> same shape and dtype.

    Works in float64 for float64 input, float32 otherwise. A block whose norm is at most
    ``eps`` becomes zero (its cosine with anything is then 0), never NaN.

    ``prescale`` is the service's micro-batch form: each block is first divided by its largest
    magnitude, so the squares of huge finite request values (float64 up to ~1e308) cannot
    overflow, and the sums are per-row ``ufunc.reduceat`` passes, so a row normalised alone
    equals the row normalised in a batch (a BLAS product with the block-indicator matrix sums
    a row differently in a batch than alone). Without it the sums are that product, which the
    bundles and reports were built with (the two differ only in the last bits).
    """
    xp = array_module(x)
    if x.shape[-1] != layout.dim:
        raise ValueError(f"vectors have {x.shape[-1]} columns, the layout has {layout.dim}")
    work = x.astype(xp.float32) if x.dtype != xp.float64 else x
    if prescale:
        offsets, dims = xp.asarray(layout.offsets), xp.asarray(layout.dims)
        peaks = xp.maximum.reduceat(xp.abs(work), offsets, axis=-1)
        work = work / xp.repeat(xp.where(peaks > 0, peaks, 1.0), dims, axis=-1)
        norms = xp.sqrt(xp.add.reduceat(work * work, offsets, axis=-1))  # (..., K)
        inv = xp.where(norms > eps, 1.0 / xp.maximum(norms, eps), 0.0).astype(work.dtype)
        return (work * xp.repeat(inv, dims, axis=-1)).astype(x.dtype, copy=False)
    m = _indicator(layout, xp, work.dtype)
    norms = xp.sqrt((work * work) @ m)  # (..., K)
    inv = 1.0 / xp.maximum(norms, eps)
    inv = xp.where(norms > eps, inv, 0.0)
    return (work * (inv @ m.T)).astype(x.dtype)


def scale_queries(queries: Array, weights: Array) -> Array:
    """Multiply block-normalised queries ``(nq, D)`` by per-column weights.

    ``weights`` is ``(D,)`` (one vector for the batch) or ``(nq, D)`` (one per row), as
    produced by :func:`esp_retrieval.subspace.weights.resolve_weights`.
    """
    xp = array_module(queries)
    w = xp.asarray(weights, dtype=queries.dtype)
    if w.shape[-1] != queries.shape[-1] or (w.ndim == 2 and w.shape[0] != queries.shape[0]):
        raise ValueError(f"weights of shape {w.shape} do not fit queries of shape {queries.shape}")
    return queries * w


def weighted_scores(scaled_queries: Array, corpus: Array) -> Array:
    """``(nq, D) @ (N, D).T -> (nq, N)``: the exact weighted score of every document."""
    return scaled_queries @ corpus.T


def topk(scores: Array, k: int) -> tuple[Array, Array]:
    """Top ``k`` per row of ``scores (nq, N)``: ``(values, indices)`` of shape ``(nq, min(k, N))``.

    Descending by score; equal scores are ordered by lower index, including ties that straddle
    the k-th place (a plain argpartition would pick among those arbitrarily).
    """
    xp = array_module(scores)
    nq, n = scores.shape
    k = min(int(k), n)
    if k <= 0:
        raise ValueError(f"k must be >= 1, got {k}")
    if k == n:
        cand = xp.broadcast_to(xp.arange(n), (nq, n))
    else:
        part = xp.argpartition(-scores, k - 1, axis=1)[:, :k]
        kth = xp.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        # Rows with more entries >= the k-th value than k have ties at the boundary:
        # re-select those rows by (score desc, index asc) over all entries at or above it.
        crowded = xp.nonzero(((scores >= kth).sum(axis=1)) > k)[0]
        cand = part
        if len(crowded):
            cand = cand.copy()
            for r in crowded.tolist():  # rare: only rows with boundary ties
                row = scores[r]
                idx = xp.nonzero(row >= kth[r, 0])[0]
                order = xp.lexsort(xp.stack([idx, -row[idx]]))
                cand[r] = idx[order[:k]]
    vals = xp.take_along_axis(scores, cand, axis=1)
    order = xp.lexsort(xp.stack([cand, -vals]), axis=-1)
    idx = xp.take_along_axis(cand, order, axis=1)
    return xp.take_along_axis(scores, idx, axis=1), idx


def subspace_scores(queries: Array, corpus: Array, rows: Array, layout: SubspaceLayout) -> Array:
    """Per-block cosines of chosen hits: ``(nq, D)``, ``(N, D)``, rows ``(nq, k)`` -> ``(nq, k, K)``.

    ``queries`` are block-normalised but *unscaled*; only the ``nq * k`` hit rows are gathered.
    """
    xp = array_module(queries)
    hits = xp.asarray(corpus[xp.asarray(rows).reshape(-1)]).reshape(*rows.shape, -1)
    work = xp.float64 if queries.dtype == xp.float64 else xp.float32
    prod = hits.astype(work) * queries.astype(work)[:, None, :]
    return prod @ _indicator(layout, xp, work)


def reference_scores(
    queries: np.ndarray, corpus: np.ndarray, block_weights: np.ndarray, layout: SubspaceLayout
) -> np.ndarray:
    """Slow float64 reference: an explicit loop over blocks, ``sum_k w_k <q_k, d_k>``.

    ``block_weights`` is ``(K,)`` or ``(nq, K)``. Used by tests and benchmarks to check the
    one-GEMM form; never on a serving path.
    """
    q = np.asarray(queries, dtype=np.float64)
    d = np.asarray(corpus, dtype=np.float64)
    w = np.broadcast_to(np.asarray(block_weights, dtype=np.float64), (q.shape[0], len(layout)))
    out = np.zeros((q.shape[0], d.shape[0]))
    for k, obj in enumerate(layout.objectives):
        sl = slice(obj.offset, obj.end)
        out += w[:, k : k + 1] * (q[:, sl] @ d[:, sl].T)
    return out
