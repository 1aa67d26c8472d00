"""``numpy``: BLAS matrix products (OpenBLAS) over row chunks, one BLAS thread per worker.

float32 scans the master corpus itself (no copy; a memory-mapped bundle stays on disk and in
the page cache). float16 keeps a half-size copy in RAM and widens each chunk before the product;
numpy's float16 cast is slow on CPUs without a vectorised path, so prefer ``torch`` for it.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import numpy as np

from esp_retrieval.subspace.engine._gemv import rows_dot
from esp_retrieval.subspace.engine.base import BackendUnavailable, Capabilities
from esp_retrieval.subspace.engine.chunked import ChunkedBackend

_controller: Any = None
_controller_lock = threading.Lock()


def blas_limiter(threads: int) -> AbstractContextManager[Any]:
    """Limit the BLAS libraries to ``threads`` threads for the duration of a ``with`` block."""
    global _controller
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is in the serve extra
        return nullcontext()
    with _controller_lock:
        if _controller is None:
            _controller = ThreadpoolController()
    return _controller.limit(limits=threads, user_api="blas")


class NumpyBackend(ChunkedBackend):
    name: ClassVar[str] = "numpy"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16")
    capabilities: ClassVar[Capabilities] = Capabilities(sparse=True)  # exact, the bundle's rows, read-only
    # batches in this range copy each float32 chunk into a per-worker buffer before a query-major
    # product: OpenBLAS then packs it from cache instead of from DRAM (bench/knn.py: less time from
    # 2 to 64 queries; at 256 the chunk is 4x larger, outgrows the cache, and the copy costs more
    # than it saves). A corpus-major product (below) reads the chunk once: the copy only adds
    # (24,884 x 384, 2-8 queries: 6.0-7.0 ms staged, 4.1-5.1 not)
    stage_batches: ClassVar[tuple[int, int]] = (33, 64)
    # batches up to this size take the product corpus-major, (rows, D) x (D, nq), then transpose
    # the small result: OpenBLAS's AVX-512 kernels (SkylakeX) run the query-major (nq, D) x
    # (D, rows) product with few queries at about half speed (chunks of 1,024-4,096 rows of a
    # 24,884 x 384 corpus: 5.3-6.5 ms against 2.7-3.0 ms at 2 queries, 7.7 against 3.3 at 8,
    # 10.8 against 8.1 at 32), while its AVX2 kernels (Haswell) run both about alike
    # (3.3 against 3.0 at 2 queries, 9.6 against 9.3 at 32; at 64 query-major is 8-14% faster)
    corpus_major_batches: ClassVar[int] = 32

    def _load(self, corpus: np.ndarray) -> None:
        precision = self.precision
        dtype = np.float32 if precision == "float32" else np.float16
        if corpus.dtype == dtype:
            self._data = corpus
        else:
            try:
                self._data = np.empty(corpus.shape, dtype)
            except MemoryError as exc:
                raise BackendUnavailable(f"numpy: no memory for a {precision} copy of the corpus") from exc
            for s in range(0, corpus.shape[0], 65536):
                self._data[s : s + 65536] = corpus[s : s + 65536]
        self._local = threading.local()

    def _worker_limits(self) -> AbstractContextManager[Any]:
        return blas_limiter(1)

    def _prepare(self, scaled: np.ndarray, lowp_products: bool) -> np.ndarray:
        return np.ascontiguousarray(scaled, dtype=np.float32)

    def _rows(self, start: int, stop: int, stage: bool = False) -> np.ndarray:
        block = self._data[start:stop]
        if block.dtype == np.float32 and not stage:
            return block
        widened = self._scratch("rows", stop - start, self.dim)
        np.copyto(widened, block)
        return widened

    def _scratch(self, name: str, rows: int, cols: int) -> np.ndarray:
        """This worker's float32 ``(rows, cols)`` buffer ``name``, grown as needed."""
        buf = getattr(self._local, name, None)
        if buf is None or buf.size < rows * cols:
            buf = np.empty(rows * cols, np.float32)
            setattr(self._local, name, buf)
        return buf[: rows * cols].reshape(rows, cols)

    def _chunk_scores(self, prepared: np.ndarray, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        nq = prepared.shape[0]
        lo, hi = self.stage_batches
        rows = self._rows(start, stop, stage=lo <= nq <= hi)
        if nq == 1:  # memory-bound: a row-dot kernel streams faster than sgemv here
            rows_dot(rows, prepared[0], out[0])
        elif nq <= self.corpus_major_batches:
            product = self._scratch("product", stop - start, nq)
            np.matmul(rows, prepared.T, out=product)
            np.copyto(out, product.T)
        else:
            np.matmul(prepared, rows.T, out=out)
        return out
