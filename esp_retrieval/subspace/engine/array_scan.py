"""The scan written over an array module: numpy on the CPU, cupy on a GPU.

:class:`ArrayScanBackend` supplies the scan of the one refine loop (:mod:`esp_retrieval.subspace.engine.base`,
docs/architecture.md section 1) on the arrays of one module ``xp``; the loop itself runs on the
same module, so a device backend keeps the corpus, the work and the candidates on the device.
The same code runs under numpy in the CPU test suite; a device backend adds only what is
faster there (:meth:`ArrayScanBackend._topk`, :meth:`ArrayScanBackend._gemm`).

The scan multiplies the loop's f-scaled queries (every value within ``[-1, 1]``) with the
corpus in chunks of rows sized to a bounded score workspace. Each chunk's top ``c`` per query
is exact and needs no full sort: the scores are split into groups of ``g`` columns, the ``c``
groups with the largest maxima are kept (every row outside them has ``c`` rows at least as
good inside them), and the top ``c`` of their ``c * g`` members is taken. Chunks are merged
into a running top ``c``. A row mask is applied in the scan (other rows score ``-inf``).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import ClassVar

import numpy as np

from esp_retrieval.subspace.engine.base import Backend, BackendUnavailable, Capabilities, EngineInputError
from esp_retrieval.subspace.engine.refine import Array
from esp_retrieval.subspace.engine.sparse_terms import SparseScan

_F16_MAX = 65504.0


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
    #: sparse blocks are added to the scan on the host (numpy): a device backend declares its own
    capabilities: ClassVar[Capabilities] = Capabilities(sparse=True)
    #: bytes of the per-step score buffer (plus a widened chunk, for low precision)
    workspace_bytes: ClassVar[int] = 8 << 20
    scan_masks: ClassVar[bool] = True

    # --- what a device backend overrides --------------------------------------------------
    def _topk(self, x: Array, c: int) -> Array:
        """Column indices ``(m, c)`` of the ``c`` largest entries of each row of ``x``, any order."""
        cut = x.shape[1] - c
        return self.xp.argpartition(x, cut, axis=1)[:, cut:]

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
        xp = self.xp
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

    # --- the search -----------------------------------------------------------------------
    def _chunk_for(self, m: int) -> int:
        if self.chunk_rows:
            return self.chunk_rows
        widen = 0 if self._data_kind == "float32" else 4 * self.dim
        return max(1024, self.workspace_bytes // (self._score_bytes() * m + widen))

    def _scan(self, scaled: Array, c: int, sparse: SparseScan | None = None) -> tuple[Array, Array]:
        return self._scan_masked(scaled, c, None, sparse)

    def _scan_masked(
        self, qscan: Array, c: int, allowed: Array, sparse: SparseScan | None = None
    ) -> tuple[Array, Array]:
        """Top ``c`` rows per query by scan score, sorted desc: ``(rows int64, scores float32)``.

        ``allowed`` (a mask on ``xp``, or ``None``): other rows score ``-inf`` (and come back as ``-1``).
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
            if sparse is not None:  # host arrays only (capabilities.sparse)
                scores = sparse.add(np.asarray(scores, np.float32), start, stop)
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
