"""``faiss``: ``IndexFlatIP`` over the block-scaled query, the CPU anchor we measure against.

Storage: float32 in ``IndexFlatIP`` (faiss keeps its own copy: memory is 2x the index while a
memory-mapped master is also resident), float16/bfloat16 in ``IndexScalarQuantizer``. faiss
scans one query at a time (SIMD) for batches below ``distance_compute_blas_threshold`` and uses
BLAS above it; its default (20) leaves small batches on the slow path, so this backend sets it
to :attr:`blas_threshold` around each search. The global is restored afterwards.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from esp_retrieval.subspace.engine.base import Backend, BackendUnavailable, Capabilities
from esp_retrieval.subspace.engine.sparse_terms import SparseScan

_ADD_CHUNK = 65536


class FaissBackend(Backend):
    name: ClassVar[str] = "faiss"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    capabilities: ClassVar[Capabilities] = Capabilities()  # exact, the bundle's rows, read-only
    blas_threshold: ClassVar[int] = 2  # batches of >= 2 queries take the BLAS path

    def _require(self) -> None:
        try:
            import faiss  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailable("faiss: not installed (pip install faiss-cpu)") from exc

    def _load(self, corpus: np.ndarray) -> None:
        import faiss

        precision, chunk_rows = self.precision, self.chunk_rows
        self._faiss = faiss
        d = corpus.shape[1]
        if precision == "float32":
            self.index: Any = faiss.IndexFlatIP(d)
        else:
            qtype = {"float16": "QT_fp16", "bfloat16": "QT_bf16"}[precision]
            if not hasattr(faiss.ScalarQuantizer, qtype):
                raise BackendUnavailable(f"faiss: this faiss build has no {qtype} (precision {precision})")
            self.index = faiss.IndexScalarQuantizer(
                d, getattr(faiss.ScalarQuantizer, qtype), faiss.METRIC_INNER_PRODUCT
            )
        step = chunk_rows or _ADD_CHUNK
        for s in range(0, corpus.shape[0], step):
            self.index.add(np.ascontiguousarray(corpus[s : s + step], dtype=np.float32))

    def _lowp_products(self, nq: int) -> bool:
        return False  # the scalar quantizer decodes to float32 before the product

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """faiss' own scan: it adds no sparse term (``capabilities.sparse`` is false)."""
        faiss = self._faiss
        before_threads = faiss.omp_get_max_threads()
        before_blas = faiss.cvar.distance_compute_blas_threshold
        faiss.omp_set_num_threads(self.threads)
        faiss.cvar.distance_compute_blas_threshold = self.blas_threshold
        try:
            scores, rows = self.index.search(np.ascontiguousarray(scaled, dtype=np.float32), c)
        finally:
            faiss.cvar.distance_compute_blas_threshold = before_blas
            faiss.omp_set_num_threads(before_threads)
        scores = np.where(rows >= 0, scores, -np.inf).astype(np.float32)
        return rows.astype(np.int64), scores

    def close(self) -> None:
        """Free faiss's own copy of the corpus now (it is not Python memory: only ``reset``
        returns it, whoever still holds the backend)."""
        index = getattr(self, "index", None)
        if index is not None:
            index.reset()
