"""Sparse blocks scored beside the dense ones in the one refine loop (docs/architecture.md s. 1).

A sparse block (:class:`esp_retrieval.subspace.sparse.SparseLexical`: BM25 as a dot product) adds
``w_s * <q_s, d_s>`` to the dense score, with ``q_s`` ``(V,)`` sparse per query and ``d_s`` the
block's row of the ``(N, V)`` document matrix. The loop treats it as one more exact term:

- the query side (:class:`SparseBatch`): the encoded rows and their weights, plus each row's
  reach ``sum_t |q_t| max_d |d_t|`` (no document scores above it; ``< 1`` for an encoded BM25
  query), which goes into ``Batch.bound`` like a dense block's ``|q_k| max |d_k|``;
- the scan (:class:`SparseScan`): ``(m, N)`` float32 scores of the f-scaled weighted queries,
  one term-at-a-time product over the posting lists (the transposed matrix, held once beside
  the block), kept sparse (one entry per query and matching document, so a query of common
  terms costs memory in proportion); a scan adds a range of its columns to each chunk of dense
  scores;
- the re-rank: the float64 dot at the candidates, weighted, added to the dense float64 score.

The scan term's rounding depends on the query (how many terms it has), not on the backend, so
it is a per-query absolute error (:meth:`SparseBatch.scan_error`) added to the scan's ``eps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.sparse import SparseLexical

_U32 = 2.0**-24


class SparseQuery(NamedTuple):
    """One sparse block's part of a search: ``vectors`` ``(nq, V)`` (scipy sparse, e.g.
    :meth:`SparseLexical.encode`) and ``weight``, a scalar or ``(nq,)``, finite and ``>= 0``."""

    vectors: Any
    weight: Any


class SparseBatch(NamedTuple):
    """The sparse blocks of a search, in the order of its ``sparse`` argument."""

    names: tuple[str, ...]
    queries: tuple[sp.csr_matrix, ...]  # per block (m, V) float64, unweighted
    weights: np.ndarray  # (m, S) float64
    reach: np.ndarray  # (m, S) float64: sum_t |q_t| max_d |d_t|, no block score exceeds it
    terms: np.ndarray  # (m,) int64: the most terms a row has in any block (its dot's length)

    def take(self, sel: Any) -> SparseBatch:
        sel = np.asarray(sel)
        queries = tuple(q[sel] for q in self.queries)
        return SparseBatch(self.names, queries, self.weights[sel], self.reach[sel], self.terms[sel])

    def bound(self) -> np.ndarray:
        """``(m,)``: ``sum_s w_s reach_s``, the most the sparse terms add to a score."""
        return (self.weights * self.reach).sum(axis=1)

    def scan_error(self, bound: np.ndarray) -> np.ndarray:
        """``(m,)`` bound on the rounding of the scan's sparse term (score units): float32 query
        and posting products summed over ``L`` terms and ``S`` blocks (Higham's ``~(L + S) u``,
        doubled), plus the float32 addition to the dense score (``u`` of the total ``bound``, doubled)."""
        n = len(self.names)
        return 2.0 * (self.terms + n + 4) * _U32 * self.bound() + 2.0 * _U32 * bound


class SparseScan:
    """Float32 scan scores ``(m, N)`` of a batch's sparse terms, stored sparse by column."""

    def __init__(self, scores: sp.spmatrix) -> None:
        csc = sp.csc_matrix(scores, dtype=np.float32)
        csc.sum_duplicates()
        self._indptr = csc.indptr
        self._rows = csc.indices
        self._data = csc.data
        self._cols = np.repeat(np.arange(csc.shape[1], dtype=np.int64), np.diff(csc.indptr))
        self._csc = csc

    def add(self, out: np.ndarray, start: int, stop: int) -> np.ndarray:
        """``out`` ``(m, stop - start)`` float32 plus the sparse scores of rows ``start:stop``."""
        lo, hi = self._indptr[start], self._indptr[stop]
        out[self._rows[lo:hi], self._cols[lo:hi] - start] += self._data[lo:hi]  # no duplicates
        return out

    def add_rows(self, out: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``out`` ``(m, len(idx))`` plus the sparse scores of rows ``idx``."""
        out += self._csc[:, idx].toarray()
        return out

    def dense(self) -> np.ndarray:
        """``(m, N)`` float32: every row's score (a scan that gathers rows in any order)."""
        return np.asarray(self._csc.toarray(), np.float32)

    def top(self, c: int) -> np.ndarray:
        """``(m, c)`` int64: per query the (up to) ``c`` rows of highest sparse scan score, in
        no order; ``-1`` pads a query that matches fewer rows (a candidate generator's extra rows)."""
        csr = self._csc.tocsr()
        out = np.full((csr.shape[0], c), -1, np.int64)
        for i in range(csr.shape[0]):
            lo, hi = csr.indptr[i], csr.indptr[i + 1]
            cols = csr.indices[lo:hi]
            if hi - lo > c:
                cols = cols[np.argpartition(-csr.data[lo:hi], c - 1)[:c]]
            out[i, : len(cols)] = cols
        return out

    def queries(self, sel: slice) -> SparseScan:
        """The scores of queries ``sel`` (a scan that splits its batch into groups)."""
        return SparseScan(self._csc[sel])


class SparseBlocks:
    """The sparse blocks a backend holds, by name, with what its scans and bound need
    (validated by :class:`esp_retrieval.subspace.engine.base.Backend`)."""

    def __init__(self, blocks: Mapping[str, SparseLexical]) -> None:
        self.blocks = dict(blocks)
        self._postings: dict[str, sp.csr_matrix] = {}
        self._max: dict[str, np.ndarray] = {}
        for name, block in self.blocks.items():
            docs = sp.csr_matrix(block.docs, dtype=np.float32)
            self._postings[name] = sp.csr_matrix(docs.T)  # (V, N): a term's documents in one row
            self._max[name] = np.asarray(abs(docs).max(axis=0).toarray(), np.float64).ravel()

    def __len__(self) -> int:
        return len(self.blocks)

    def batch(self, parts: Mapping[str, tuple[sp.csr_matrix, np.ndarray]]) -> SparseBatch:
        """The :class:`SparseBatch` of validated parts: name -> ((nq, V) float64 csr with sorted
        indices, (nq,) float64 weights)."""
        names = tuple(parts)
        queries = tuple(parts[n][0] for n in names)
        weights = np.stack([parts[n][1] for n in names], axis=1)
        reach = np.stack([abs(q) @ self._max[n] for n, q in zip(names, queries, strict=True)], axis=1)
        terms = np.max(np.stack([np.diff(q.indptr) for q in queries]), axis=0)
        return SparseBatch(names, queries, weights, reach, terms.astype(np.int64))

    def scan(self, part: SparseBatch, factor: np.ndarray) -> SparseScan:
        """Float32 scan scores of the weighted queries times ``factor`` ``(m,)`` (the scan's units)."""
        total: sp.spmatrix | None = None
        for i, name in enumerate(part.names):
            scale = part.weights[:, i] * factor
            q = sp.csr_matrix(sp.diags(scale) @ part.queries[i], dtype=np.float32)
            s = q @ self._postings[name]  # float32 term-at-a-time over the query's postings
            total = s if total is None else total + s
        assert total is not None
        return SparseScan(total)

    def raw(self, part: SparseBatch, rows: np.ndarray) -> np.ndarray:
        """``(m, M, S)`` float64 block scores ``<q_s, d_s>`` of candidate ``rows`` (``-1``: 0)."""
        pairs = zip(part.names, part.queries, strict=True)
        return np.stack([self.blocks[n].scores_at(q, rows) for n, q in pairs], axis=-1)

    def exact(self, part: SparseBatch, rows: np.ndarray) -> np.ndarray:
        """``(m, M)`` float64 ``sum_s w_s <q_s, d_s>`` of candidate ``rows`` (``-1``: 0)."""
        raw = self.raw(part, rows)
        out = np.zeros(rows.shape, np.float64)
        for i in range(raw.shape[-1]):
            out += part.weights[:, i, None] * raw[..., i]
        return out
