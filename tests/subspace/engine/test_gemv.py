"""The batch-1 row-dot kernels agree with a float64 product, contiguous or not."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.subspace.engine import _gemv


@pytest.mark.parametrize("name", [n for n, k in _gemv.KERNELS.items() if k is not None])
def test_rows_dot_kernels_match_float64(name: str) -> None:
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((1000, 37)).astype(np.float32)
    q = rng.standard_normal(37).astype(np.float32)
    kernel = _gemv.KERNELS[name]
    assert kernel is not None
    want = rows.astype(np.float64) @ q.astype(np.float64)
    out = np.empty(1000, np.float32)
    kernel(rows, q, out)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-4)
    strided = np.empty(2000, np.float32)[::2]  # not contiguous: the kernel must still be right
    kernel(rows[::-1], q, strided)
    np.testing.assert_allclose(strided, want[::-1], rtol=0, atol=1e-4)


def test_the_fastest_available_kernel_is_chosen() -> None:
    first = next(n for n, k in _gemv.KERNELS.items() if k is not None)
    assert first == _gemv.KERNEL_NAME
    pytest.importorskip("faiss")
    assert _gemv.KERNEL_NAME == "faiss"


@pytest.mark.parametrize("name", [n for n, k in _gemv.INDEXED_KERNELS.items() if k is not None])
def test_indexed_kernels_score_the_chosen_rows_in_place(name: str) -> None:
    rng = np.random.default_rng(8)
    matrix = rng.standard_normal((500, 37)).astype(np.float32)
    matrix.flags.writeable = False  # the served master is read-only
    q = rng.standard_normal(37).astype(np.float32)
    rows = np.array([499, 3, 3, 0, 250], np.int64)  # any order, repeats allowed
    kernel = _gemv.INDEXED_KERNELS[name]
    assert kernel is not None
    want = matrix[rows].astype(np.float64) @ q.astype(np.float64)
    out = np.empty(len(rows), np.float32)
    kernel(matrix, rows, q, out)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-4)
    # int32 rows or a strided matrix take the copying path, with the same answer
    kernel(matrix[:, :], rows.astype(np.int32), q, out)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-4)
    wide = np.zeros((500, 74), np.float32)
    wide[:, ::2] = matrix
    kernel(wide[:, ::2], rows, q, out)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-4)
    # the same float32 value as the row-dot kernel on a gathered copy (the refine loop's eps is the scan's)
    np.testing.assert_array_equal(
        _gemv.indexed_rows_dot(matrix, rows, q, np.empty(len(rows), np.float32)),
        _gemv.rows_dot(np.ascontiguousarray(matrix[rows]), q, np.empty(len(rows), np.float32)),
    )
