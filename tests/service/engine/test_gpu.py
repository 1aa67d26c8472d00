"""The ``cupy`` backend on a CUDA device: the same exactness contract as the CPU backends.

Skipped without CUDA (``pytest -m gpu`` selects these on a GPU machine). On the CPU the same
array code runs under numpy (``test_array_scan.py``, and every shared engine test).
"""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.service.engine.cupy_backend import cuda_unavailable_reason
from tests.service.engine.conftest import layout_of, random_rows, reference_topk
from tests.service.engine.test_lowp import near_duplicates

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_unavailable_reason() is not None, reason=str(cuda_unavailable_reason())),
]

LAYOUT = layout_of("three")


@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16"])
def test_cupy_matches_float64_reference(make_engine, precision: str) -> None:
    corpus = random_rows(5000, LAYOUT, seed=51)
    queries = random_rows(9, LAYOUT, seed=52)
    weights = np.random.default_rng(53).uniform(0, 2, (9, 3))
    engine = make_engine("cupy", corpus, LAYOUT, precision=precision)
    for k in (1, 10, 1000, 2048, 6000):
        res = engine.search(queries, weights, k)
        rows, scores = reference_topk(queries, corpus, weights, LAYOUT, min(k, 5000))
        np.testing.assert_array_equal(res.rows, rows)
        np.testing.assert_allclose(res.scores, scores, rtol=0, atol=1e-6)
    assert res.subspace_scores.shape == (9, 5000, 3)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_cupy_chunks_and_near_duplicates_stay_exact(make_engine, precision: str) -> None:
    corpus = near_duplicates(33)
    queries = np.ascontiguousarray(corpus[::150] + 1e-3, dtype=np.float32)
    w = np.ones(3)
    engine = make_engine("cupy", corpus, LAYOUT, precision=precision, chunk_rows=256)
    res = engine.search(queries, w, 10)
    np.testing.assert_array_equal(res.rows, reference_topk(queries, corpus, w, LAYOUT, 10)[0])
    assert engine.rescans > 0


def test_cupy_filtered_search(make_engine) -> None:
    corpus = random_rows(3000, LAYOUT, seed=54)
    queries = random_rows(4, LAYOUT, seed=55)
    mask = np.random.default_rng(56).random(3000) < 0.1
    engine = make_engine("cupy", corpus, LAYOUT, precision="float16")
    res = engine.search(queries, np.ones(3), 20, allowed=mask)
    sub = np.flatnonzero(mask)
    want = reference_topk(queries, corpus[sub], np.ones(3), LAYOUT, 20)[0]
    np.testing.assert_array_equal(res.rows, sub[want])


def test_cupy_uses_the_tensor_core_path_and_a_device_selection(make_engine) -> None:
    import cupy

    engine = make_engine("cupy", random_rows(100, LAYOUT, 57), LAYOUT, precision="float16")
    assert isinstance(engine._data, cupy.ndarray) and engine._data.dtype == np.float16
    assert isinstance(engine._master_dev, cupy.ndarray)
    assert engine.selection in ("torch.topk", "argpartition")
