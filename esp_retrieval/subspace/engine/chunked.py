"""Chunked scan shared by the CPU matrix-product backends (numpy, torch).

The corpus is split into one contiguous row range per thread; each worker scans its range
``chunk_rows`` at a time into a reused score buffer ``(nq, chunk_rows)`` and feeds a
:class:`TopCandidates`. The working set is therefore ``threads * nq * chunk_rows`` floats plus
the candidates, never ``nq x N``. Workers run in Python threads: the matrix products and the
comparisons release the GIL, and each worker's library call is limited to one thread so the
two levels of parallelism do not oversubscribe the cores.
"""

from __future__ import annotations

import itertools
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from esp_retrieval.subspace.engine._select import TopCandidates
from esp_retrieval.subspace.engine.base import Backend, BackendUnavailable
from esp_retrieval.subspace.engine.sparse_terms import SparseScan

_WORKING_SET = 1 << 20  # score-buffer floats per worker (4 MiB, cache-sized) when chunk_rows is not given
_MAX_GROUP = 512  # queries scanned together; larger batches are split


class ChunkedBackend(Backend):
    """A :class:`Backend` whose scan is ``_chunk_scores`` over row chunks, in worker threads."""

    _pool: ThreadPoolExecutor | None = None
    _closed: bool = False
    _pool_lock: threading.Lock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._pool_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    @abstractmethod
    def _prepare(self, scaled: np.ndarray, lowp_products: bool) -> Any:
        """Queries ``(nq, D)`` float32 -> the form ``_chunk_scores`` wants (e.g. a tensor).

        ``lowp_products``: the scan may round queries and products to the storage precision
        (decided once per scan, as the completeness bound of :class:`Backend` assumes).
        """

    @abstractmethod
    def _chunk_scores(self, prepared: Any, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Scan scores of rows ``start:stop``, written into ``out`` ``(nq, stop - start)`` float32."""

    def _worker_limits(self) -> AbstractContextManager[Any]:
        """Context entered around a whole scan, e.g. one BLAS thread per worker."""
        return nullcontext()

    def _worker_initializer(self) -> Callable[[], None] | None:
        """What runs once in each worker thread (per-thread settings, e.g. torch's thread count).

        It must not hold the backend (no bound method): the pool's idle threads keep their
        initializer alive, and a backend they kept alive would never be collected or closed.
        """
        return None

    def _chunk_for(self, nq: int) -> int:
        """Rows per step. One query streams long chunks; a batched product wants the corpus
        chunk (which BLAS packs) and the score buffer to stay in cache (sizes chosen with
        bench/knn.py: fewer rows for small batches, more for large ones)."""
        if self.chunk_rows:
            return self.chunk_rows
        if nq == 1:
            return 65536
        return 1024 if nq <= 64 else int(min(4096, max(1024, _WORKING_SET // nq)))

    def _ranges(self, chunk: int) -> list[tuple[int, int]]:
        n = self.num_docs
        workers = max(1, min(self.threads, -(-n // chunk)))
        bounds = np.linspace(0, n, workers + 1).astype(np.int64)
        return [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        lowp = self._lowp_products(len(scaled))
        whole = len(scaled) <= _MAX_GROUP
        parts = [
            self._scan_group(
                scaled[i : i + _MAX_GROUP],
                c,
                lowp,
                sparse if sparse is None or whole else sparse.queries(slice(i, i + _MAX_GROUP)),
            )
            for i in range(0, len(scaled), _MAX_GROUP)
        ]
        if len(parts) == 1:
            return parts[0]
        m = max(p[0].shape[1] for p in parts)
        rows = np.concatenate(
            [np.pad(r, ((0, 0), (0, m - r.shape[1])), constant_values=-1) for r, _ in parts]
        )
        scores = np.concatenate(
            [np.pad(s, ((0, 0), (0, m - s.shape[1])), constant_values=-np.inf) for _, s in parts]
        )
        return rows, scores

    def _scan_group(
        self, scaled: np.ndarray, c: int, lowp: bool, sparse: SparseScan | None
    ) -> tuple[np.ndarray, np.ndarray]:
        nq = scaled.shape[0]
        # every worker gets rows, even when the corpus is smaller than threads * chunk
        chunk = min(self._chunk_for(nq), max(256, -(-self.num_docs // self.threads)))
        prepared = self._prepare(scaled, lowp)

        def work(span: tuple[int, int]) -> TopCandidates:
            sel = TopCandidates(nq, c)
            buf = np.empty(nq * min(chunk, span[1] - span[0]), np.float32)
            for start, stop in _chunks(span, chunk):
                out = buf[: nq * (stop - start)].reshape(nq, stop - start)
                scores = self._chunk_scores(prepared, start, stop, out)
                sel.add(scores if sparse is None else sparse.add(scores, start, stop), start)
            return sel

        ranges = self._ranges(chunk)
        # a single query runs the row-dot kernels (subspace.engine._gemv), which call no threaded
        # BLAS: skip the limiter, whose enter/exit costs more than a small scan
        with self._worker_limits() if nq > 1 else nullcontext():
            sels = [work(ranges[0])] if len(ranges) == 1 else list(self._worker_pool().map(work, ranges))
        sels[0].absorb(sels[1:])
        return sels[0].result()

    def _worker_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._closed:
                raise BackendUnavailable(f"{self.name}: the engine is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.threads, f"esp-{self.name}", initializer=self._worker_initializer()
                )
            return self._pool

    def set_threads(self, threads: int) -> None:
        super().set_threads(threads)
        self._stop_pool()  # the pool is re-created with the new size on the next scan

    def _stop_pool(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def close(self) -> None:
        """Stop the worker threads for good (also done at garbage collection); later scans
        that need them raise :class:`BackendUnavailable`. Idempotent."""
        self._closed = True
        self._stop_pool()
        super().close()

    def __del__(self) -> None:
        if getattr(self, "_pool_lock", None) is not None:
            self._stop_pool()


def _chunks(span: tuple[int, int], chunk: int) -> Iterator[tuple[int, int]]:
    for start in range(span[0], span[1], chunk):
        yield start, min(span[1], start + chunk)
