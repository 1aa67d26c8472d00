"""One query against many rows: the batch-1 scan kernel, the memory-bound case.

A batch-1 scan reads every stored byte once, so its speed is the read bandwidth the kernel
sustains. Streaming kernels rank, as a fraction of plain read bandwidth (``bench/knn.py``
compares them on the machine at hand): faiss ``fvec_inner_products_ny`` first, numpy ``vecdot``
(one BLAS dot call per row) next, OpenBLAS sgemv and ``torch.mv`` last.
So the faiss kernel is used when faiss is installed and the rows are contiguous float32;
numpy's row-dot loop otherwise. Both release the GIL, so worker threads scan in parallel.

:func:`indexed_rows_dot` scores chosen rows of a matrix in place (faiss
``fvec_inner_products_by_idx``): no gathered copy, whose fresh pages cost more than the dot
(10,000 rows of 5.76 KB out of 1M: 10 ms in place against 26 ms to gather plus 4 ms to dot).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
IndexedKernel = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


def _numpy_rows_dot(rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    np.vecdot(rows, q, out=out)


def _numpy_indexed(matrix: np.ndarray, rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    np.vecdot(matrix[rows], q, out=out)


def _faiss_function(name: str) -> Any:
    """faiss's ``name`` and ``swig_ptr``, or ``None`` without faiss (an untyped swig module)."""
    try:
        import faiss
    except ImportError:
        return None
    return getattr(faiss, name), faiss.swig_ptr


def _contiguous_float32(*arrays: np.ndarray) -> bool:
    """faiss reads raw pointers: every array float32, C-contiguous and non-empty."""
    return all(a.dtype == np.float32 and a.flags.c_contiguous and a.size for a in arrays)


def _faiss_kernel() -> Kernel | None:
    found = _faiss_function("fvec_inner_products_ny")
    if found is None:
        return None
    inner_products, ptr = found

    def rows_dot(rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
        if not _contiguous_float32(rows, q, out):
            _numpy_rows_dot(rows, q, out)
            return
        inner_products(ptr(out), ptr(q), ptr(rows), rows.shape[1], rows.shape[0])

    return rows_dot


def _faiss_indexed_kernel() -> IndexedKernel | None:
    found = _faiss_function("fvec_inner_products_by_idx")
    if found is None:
        return None
    by_idx, ptr = found

    def indexed(matrix: np.ndarray, rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
        if not (_contiguous_float32(matrix, q, out) and rows.dtype == np.int64 and rows.flags.c_contiguous):
            _numpy_indexed(matrix, rows, q, out)
            return
        by_idx(ptr(out), ptr(q), ptr(matrix), ptr(rows), matrix.shape[1], 1, len(rows))

    return indexed


# registry: kernel name -> implementation, fastest first; None = not available here
KERNELS: dict[str, Kernel | None] = {"faiss": _faiss_kernel(), "numpy": _numpy_rows_dot}
KERNEL_NAME: str = next(name for name, k in KERNELS.items() if k is not None)
INDEXED_KERNELS: dict[str, IndexedKernel | None] = {"faiss": _faiss_indexed_kernel(), "numpy": _numpy_indexed}
INDEXED_KERNEL_NAME: str = next(name for name, k in INDEXED_KERNELS.items() if k is not None)


def rows_dot(rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[i] = <rows[i], q>``: ``rows`` ``(C, D)`` float32, ``q`` ``(D,)``, ``out`` ``(C,)``."""
    kernel = KERNELS[KERNEL_NAME]
    assert kernel is not None
    kernel(rows, q, out)
    return out


def indexed_rows_dot(matrix: np.ndarray, rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[i] = <matrix[rows[i]], q>``: ``matrix`` ``(N, D)``, ``rows`` ``(C,)`` int64 in
    ``[0, N)`` (unchecked by the faiss kernel: the caller's rows come from the index), ``q``
    ``(D,)``, ``out`` ``(C,)`` float32; no ``(C, D)`` copy is made."""
    kernel = INDEXED_KERNELS[INDEXED_KERNEL_NAME]
    assert kernel is not None
    kernel(matrix, rows, q, out)
    return out
