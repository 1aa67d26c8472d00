"""Exact weighted top k written once over an array module: numpy on the CPU, cupy on a GPU.

The recipe of :mod:`subspace.engine.base` (scan, completeness check, exact re-rank; see
docs/architecture.md section 1), with every step on the arrays of one module ``xp``, so a
device backend keeps the corpus, the work and the candidates on the device. Per search the
host sends the queries and weights once and receives the results once (with a ``(nq,)`` flag
saying which queries need a wider candidate set; they are rescanned, rarely). The same code
runs under numpy in the CPU test suite; a device backend adds only what is faster there
(:meth:`ArrayScanBackend._topk`, :meth:`ArrayScanBackend._gemm`).

1. **scan**: queries are block-scaled, then divided per row by ``max_k w_k |q_k|`` (a positive
   factor changes no ranking and keeps every scaled value within ``[-1, 1]``, so a float16
   query neither overflows nor flushes its largest block to zero). The corpus is multiplied
   in chunks of rows sized to a bounded score workspace. Each chunk's top ``c`` per query is
   exact and needs no full sort: the scores are split into groups of ``g`` columns, the ``c``
   groups with the largest maxima are kept (every row outside them has ``c`` rows at least as
   good inside them), and the top ``c`` of their ``c * g`` members is taken. Chunks are merged
   into a running top ``c``.
2. **completeness** and **pruning**: the bound of :class:`subspace.engine.base.Backend`
   (``eps`` from the scan's roundoff, in the scan's units), on the device.
3. **exact re-rank**: candidates gathered from the master (float32 or float16, as given) on the
   device, scored in float64, ordered by (score desc, row asc) with two stable sorts.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from subspace.engine.base import Backend, BackendUnavailable, EngineInputError, SearchResult, exact_scores
from subspace.scoring import subspace_scores

Array = Any  # an array of the backend's module (numpy.ndarray, cupy.ndarray)

_F16_MAX = 65504.0
_F16_SUB = 2.0**-25  # absolute rounding error of a float16 subnormal (|x| < 2**-14)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (finite input)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def widen_bf16(xp: ModuleType, bits: Array) -> Array:
    """bfloat16 bit patterns (uint16) -> float32: the bits are the high half of a float32."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


class ArrayScanBackend(Backend):
    """A :class:`Backend` whose whole search runs on the arrays of :meth:`_array_module`.

    Storage: ``float32`` scans the master itself; ``float16`` keeps a half-size copy;
    ``bfloat16`` keeps the bit patterns (uint16) and widens each chunk to float32 before the
    product (neither numpy nor cupy multiplies bfloat16). The master stays as given on the host
    and, for a device module, is copied to the device once for the re-rank (the scan copy
    itself when the storage dtype is the master's). This class itself runs on numpy: the reference the device
    backend is tested against, and the code path the CPU suite runs.
    """

    name: ClassVar[str] = "array"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    #: bytes of the per-step score buffer (plus a widened chunk, for low precision)
    workspace_bytes: ClassVar[int] = 8 << 20
    #: float64 elements gathered at once by the re-rank and the per-subspace scores
    rerank_elements: ClassVar[int] = 1 << 21

    # --- what a device backend overrides --------------------------------------------------
    def _array_module(self) -> ModuleType:
        return np

    def _to_device(self, x: np.ndarray) -> Array:
        return self.xp.asarray(x)

    def _to_host(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def _topk(self, x: Array, c: int) -> Array:
        """Column indices ``(m, c)`` of the ``c`` largest entries of each row of ``x``, any order."""
        cut = x.shape[1] - c
        return self.xp.argpartition(x, cut, axis=1)[:, cut:]

    def _stable_argsort(self, x: Array) -> Array:
        """Per-row ascending order of ``x`` ``(m, M)``, equal entries kept in column order."""
        return self.xp.argsort(x, axis=1, kind="stable")

    def _prepare(self, qscan: Array) -> Array:
        """Scan-ready queries from float32 ``(m, D)`` (e.g. rounded to float16 for tensor cores)."""
        return qscan

    def _gemm(self, prepared: Array, start: int, stop: int) -> Array:
        """Scan scores ``(m, stop - start)`` of corpus rows ``start:stop``."""
        xp = self.xp
        block = self._data[start:stop]
        if self._data_kind == "bfloat16":
            block = widen_bf16(xp, block)
        elif block.dtype != xp.float32:
            block = block.astype(xp.float32)
        return xp.matmul(prepared, block.T)

    def _score_bytes(self) -> int:
        """Bytes per scan score (float32 here; a float16 product writes 2)."""
        return 4

    # --- loading --------------------------------------------------------------------------
    def _load(self, corpus: np.ndarray) -> None:
        xp = self.xp = self._array_module()
        precision = self.precision
        self._data_kind = precision
        if precision == "float16" and float(self._max_block_norm.sum()) * 2.0 >= _F16_MAX:
            raise EngineInputError(
                "corpus block norms are too large for float16 storage (scores would overflow)", "corpus"
            )
        store = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[precision]
        n = corpus.shape[0]
        # the stored form is the master itself: one copy serves the scan and the re-rank
        same = corpus.dtype == np.dtype(store)
        try:
            if same:
                self._data = self._to_device(corpus)  # numpy: the master itself, not a copy
            else:
                self._data = xp.empty(corpus.shape, dtype=store)
                for s in range(0, n, 65536):
                    block = np.asarray(corpus[s : s + 65536])
                    block = bf16_bits(block) if precision == "bfloat16" else block.astype(store)
                    self._data[s : s + len(block)] = self._to_device(block)
            self._master_dev = self._data if same else self._to_device(corpus)
        except MemoryError as exc:  # numpy; a device module raises its own out-of-memory error
            raise BackendUnavailable(f"{self.name}: no memory for the corpus ({precision})") from exc
        layout = self.layout
        self._block_of = xp.asarray(layout.block_ids())
        self._ind64 = xp.asarray(layout.indicator(np.float64))
        self._maxnorm = xp.asarray(self._max_block_norm)
        dims = np.asarray(layout.dims, np.float64)
        # float16 queries and scores: a subnormal is off by up to 2**-25 absolute, not relative
        self._lowp_abs = _F16_SUB * (float(np.sqrt(dims) @ self._max_block_norm) + 1.0)

    # --- the search -----------------------------------------------------------------------
    def _chunk_for(self, m: int) -> int:
        if self.chunk_rows:
            return self.chunk_rows
        widen = 0 if self._data_kind == "float32" else 4 * self.dim
        return max(1024, self.workspace_bytes // (self._score_bytes() * m + widen))

    def _eps(self, m: int, scale: Array, f: Array) -> Array:
        """Bound on ``|s' - s|`` per query, in the units of the f-scaled scan."""
        eps = self._scan_rel_error(m) * scale * f
        return eps + self._lowp_abs if self._lowp_products(m) else eps

    def search(
        self, queries: np.ndarray, block_weights: np.ndarray, k: int, allowed: Any = None
    ) -> SearchResult:
        """Exact weighted top ``k`` (see :meth:`Backend.search`), on the arrays of ``xp``.

        ``allowed``: ``None`` or an ``(N,)`` boolean mask of the rows that may be returned; the
        scan scores the other rows ``-inf``, so the candidates, the bound and the re-rank are
        those of the allowed rows (``min(k, allowed.sum())`` hits per query).
        """
        q, w, k = self._validate(queries, block_weights, k)
        mask = None if allowed is None else self._check_allowed(allowed)
        xp = self.xp
        nq, n, nk = q.shape[0], self.num_docs, len(self.layout)
        n_ok = n if mask is None else int(mask.sum())
        kk = min(k, n_ok)
        if kk == 0:
            none = np.empty((nq, 0))
            return SearchResult(none.astype(np.float32), none.astype(np.int64),
                                np.empty((nq, 0, nk), np.float32))
        qd = self._to_device(q)  # the one upload of the queries ...
        wd = self._to_device(np.ascontiguousarray(w, dtype=np.float64))  # ... and of the weights
        ok = None if mask is None else self._to_device(mask)  # ... and of a filter, when given
        q64 = qd.astype(xp.float64)
        scaled64 = q64 * wd[:, self._block_of]
        bnorm = wd * xp.sqrt((q64 * q64) @ self._ind64)  # (nq, K): w_k |q_k|
        scale = bnorm @ self._maxnorm  # bound on sum_k w_k |q_k| |d_k|
        top = bnorm.max(axis=1)
        f = 1.0 / xp.where(top > 0, top, 1.0)
        qscan = (scaled64 * f[:, None]).astype(xp.float32)

        out_rows = np.empty((nq, kk), np.int64)
        out_scores = np.empty((nq, kk), np.float32)
        out_sub = np.empty((nq, kk, nk), np.float32)
        pending = np.arange(nq)
        c = self.candidates(kk)
        while True:
            sel = slice(None) if len(pending) == nq else self._to_device(pending)
            m = len(pending)
            done: Array = None
            if c >= n_ok:  # every (allowed) row is a candidate
                every = np.arange(n) if mask is None else np.flatnonzero(mask)
                rows = xp.broadcast_to(self._to_device(every.astype(np.int64)), (m, n_ok))
            else:
                rows, scan = self._scan_device(qscan[sel], c, ok)
                eps = self._eps(m, scale[sel], f[sel])
                done = self._complete_d(scan, kk, c, eps)
                rows = self._prune_d(rows, scan, kk, eps)
            r, s = self._rerank_d(scaled64[sel], rows, kk)
            sub = self._subspace_d(qd[sel], r)
            # the one transfer back: results, and which queries the bound accepts
            done_h = np.ones(m, bool) if done is None else self._to_host(done)
            rh, sh, subh = self._to_host(r), self._to_host(s), self._to_host(sub)
            idx = pending[done_h]
            out_rows[idx], out_scores[idx], out_sub[idx] = rh[done_h], sh[done_h], subh[done_h]
            if done_h.all():
                break
            self.rescans += int((~done_h).sum())
            pending = pending[~done_h]
            c *= 4
        return SearchResult(out_scores, out_rows, out_sub)

    def _scan(self, scaled: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
        """The contract's scan on host arrays (tests and tools; :meth:`search` stays on the device)."""
        rows, scores = self._scan_device(self._to_device(np.ascontiguousarray(scaled, np.float32)), c)
        return self._to_host(rows), self._to_host(scores)

    def _scan_device(self, qscan: Array, c: int, allowed: Array = None) -> tuple[Array, Array]:
        """Top ``c`` rows per query by scan score, sorted desc: ``(rows int64, scores float32)``.

        ``allowed`` (a device mask, optional): other rows score ``-inf`` (and come back as ``-1``).
        """
        xp = self.xp
        m, n = qscan.shape[0], self.num_docs
        c = min(c, n)
        prepared = self._prepare(qscan)
        chunk = self._chunk_for(m)
        best_s: Array = None
        best_r: Array = None
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            scores = self._gemm(prepared, start, stop)
            if allowed is not None:
                scores = xp.where(allowed[None, start:stop], scores, -xp.inf)
            vals, cols = self._chunk_top(scores, c)
            cols = cols + start
            if best_s is None:
                best_s, best_r = vals, cols
            else:
                best_s = xp.concatenate([best_s, vals], axis=1)
                best_r = xp.concatenate([best_r, cols], axis=1)
            if best_s.shape[1] > c:
                keep = self._topk(best_s, c)
                best_s = xp.take_along_axis(best_s, keep, axis=1)
                best_r = xp.take_along_axis(best_r, keep, axis=1)
        order = xp.argsort(-best_s, axis=1)
        return xp.take_along_axis(best_r, order, axis=1), xp.take_along_axis(best_s, order, axis=1)

    def _chunk_top(self, scores: Array, c: int) -> tuple[Array, Array]:
        """Exact top ``c`` per row of one chunk's scores ``(m, C)``: ``(values float32, columns)``.

        Groups of ``g ~ sqrt(C / c)`` columns: the ``c`` groups with the largest maxima hold
        a top ``c`` (a row outside them is beaten by each of their ``c`` maxima), so only
        ``C / g + c g`` entries are ever selected among, and ``C`` entries only compared.
        """
        xp = self.xp
        m, width = scores.shape
        if width <= c:
            vals = scores.astype(xp.float32)
            cols = xp.broadcast_to(xp.arange(width, dtype=xp.int64), (m, width))
            return vals, xp.where(vals > -xp.inf, cols, -1)
        g = max(1, math.isqrt(width // c))
        if g > 1:
            groups = -(-width // g)
            if groups * g > width:
                pad = xp.full((m, groups * g - width), -xp.inf, dtype=scores.dtype)
                scores = xp.concatenate([scores, pad], axis=1)
            grouped = scores.reshape(m, groups, g)
            pick = self._topk(grouped.max(axis=2), c)  # (m, c) group ids
            index = xp.broadcast_to(pick[:, :, None], (m, c, g))
            members = xp.take_along_axis(grouped, index, axis=1).reshape(m, c * g)
            cols = (pick[:, :, None].astype(xp.int64) * g + xp.arange(g, dtype=xp.int64)).reshape(m, c * g)
        else:
            members = scores
            cols = xp.broadcast_to(xp.arange(width, dtype=xp.int64), (m, width))
        keep = self._topk(members, c)
        vals = xp.take_along_axis(members, keep, axis=1).astype(xp.float32)
        cols = xp.take_along_axis(cols, keep, axis=1)
        return vals, xp.where(vals > -xp.inf, cols, -1)  # padding never wins against real rows

    def _complete_d(self, scan: Array, k: int, c: int, eps: Array) -> Array:
        """Per query: no row outside the ``c`` candidates can reach the exact top ``k``."""
        xp = self.xp
        gap = scan[:, k - 1].astype(xp.float64) - 2.0 * eps
        return scan[:, c - 1].astype(xp.float64) < gap

    def _prune_d(self, rows: Array, scan: Array, k: int, eps: Array) -> Array:
        """:meth:`Backend._prune` on the device: rows below the band become ``-1`` (no resize,
        so no transfer to learn the width; a device gathers row 0 for them from cache)."""
        xp = self.xp
        cut = scan[:, k - 1].astype(xp.float64) - 2.0 * eps
        keep = scan.astype(xp.float64) >= cut[:, None]
        keep[:, :k] = True
        return xp.where(keep, rows, -1)

    def _rerank_d(self, scaled64: Array, rows: Array, k: int) -> tuple[Array, Array]:
        """Float64 scores of candidate ``rows`` ``(m, M)`` (``-1`` = none); exact top ``k``."""
        xp = self.xp
        master = self._master_dev
        exact = exact_scores(xp, lambda i: master[i].astype(xp.float64), scaled64, rows, self.rerank_elements)
        # (score desc, row asc): order by row, then a stable sort by score
        by_row = xp.argsort(xp.where(rows >= 0, rows, self.num_docs), axis=1)
        rows = xp.take_along_axis(rows, by_row, axis=1)
        exact = xp.take_along_axis(exact, by_row, axis=1)
        order = self._stable_argsort(-exact)[:, :k]
        top = xp.take_along_axis(exact, order, axis=1).astype(xp.float32)
        return xp.take_along_axis(rows, order, axis=1), top

    def _subspace_d(self, q: Array, rows: Array) -> Array:
        """Per-block cosines ``(m, k, K)`` float32 of the hits, in query blocks."""
        xp = self.xp
        m, k = rows.shape
        step = max(1, self.rerank_elements // (k * self.dim))
        parts = [
            subspace_scores(q[q0 : q0 + step], self._master_dev, rows[q0 : q0 + step], self.layout)
            for q0 in range(0, m, step)
        ]
        out = parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=0)
        return out.astype(xp.float32)

    def close(self) -> None:
        """Release what the backend holds (nothing beyond the arrays here)."""

    def warmup(self) -> None:
        q = np.asarray(self.master[:1], dtype=np.float32)
        self.search(q, self.layout.default_weights(), min(10, self.num_docs))

