"""One query against many rows: the batch-1 scan kernel, the memory-bound case.

A batch-1 scan reads every stored byte once, so its speed is the read bandwidth the kernel
sustains. Streaming kernels rank, as a fraction of plain read bandwidth (``bench/knn.py``
compares them on the machine at hand): faiss ``fvec_inner_products_ny`` first, numpy ``vecdot``
(one BLAS dot call per row) next, OpenBLAS sgemv and ``torch.mv`` last.
So the faiss kernel is used when faiss is installed and the rows are contiguous float32;
numpy's row-dot loop otherwise. Both release the GIL, so worker threads scan in parallel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _numpy_rows_dot(rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    np.vecdot(rows, q, out=out)


def _faiss_kernel() -> Kernel | None:
    try:
        import faiss
    except ImportError:
        return None
    ptr: Any = faiss.swig_ptr
    inner_products: Any = getattr(faiss, "fvec_inner_products_ny")  # noqa: B009 - untyped swig module

    def rows_dot(rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
        if not (
            rows.dtype == q.dtype == out.dtype == np.float32
            and rows.flags.c_contiguous
            and q.flags.c_contiguous
            and out.flags.c_contiguous
            and len(rows)
        ):
            np.vecdot(rows, q, out=out)
            return
        inner_products(ptr(out), ptr(q), ptr(rows), rows.shape[1], rows.shape[0])

    return rows_dot


# registry: kernel name -> implementation, fastest first; None = not available here
KERNELS: dict[str, Kernel | None] = {"faiss": _faiss_kernel(), "numpy": _numpy_rows_dot}
KERNEL_NAME: str = next(name for name, k in KERNELS.items() if k is not None)


def rows_dot(rows: np.ndarray, q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[i] = <rows[i], q>``: ``rows`` ``(C, D)`` float32, ``q`` ``(D,)``, ``out`` ``(C,)``."""
    kernel = KERNELS[KERNEL_NAME]
    assert kernel is not None
    kernel(rows, q, out)
    return out
