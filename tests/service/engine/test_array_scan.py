"""The array-module search (the ``cupy`` backend's code) on numpy: selection, transfers, bounds.

``array`` is the generic code with numpy's argpartition; ``cupy-on-numpy`` is the ``cupy``
backend's own class (float16 products with float16 scores, torch.topk over DLPack) with numpy
as its array module. On a device the same code runs on cupy arrays (``test_gpu.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from esp_retrieval.subspace.engine.array_scan import ArrayScanBackend, bf16_bits, widen_bf16
from esp_retrieval.subspace.engine.base import EngineInputError
from tests.service.engine.conftest import CupyOnNumpy, layout_of, random_rows, reference_topk

ARRAY_ENGINES = [ArrayScanBackend.name, CupyOnNumpy.name]
LAYOUT = layout_of("three")


@pytest.mark.parametrize("width", [7, 64, 1000, 1001, 4099])
@pytest.mark.parametrize("c", [1, 5, 74])
def test_grouped_selection_is_an_exact_top_c(make_engine, width: int, c: int) -> None:
    """Values drawn from a few levels: ties everywhere, also across the cut and group borders."""
    engine = make_engine(ArrayScanBackend.name, random_rows(10, LAYOUT, 0), LAYOUT)
    rng = np.random.default_rng(width * 100 + c)
    scores = rng.integers(0, 9, (6, width)).astype(np.float32) / 8
    vals, cols = engine._chunk_top(scores, c)
    want = -np.sort(-scores, axis=1)[:, : min(c, width)]
    np.testing.assert_array_equal(-np.sort(-vals, axis=1), want)
    assert ((cols >= 0) & (cols < width)).all()
    np.testing.assert_array_equal(np.take_along_axis(scores, cols, 1), vals)  # columns match values
    assert all(len(set(row)) == len(row) for row in cols.tolist())  # no column twice


def test_bf16_bits_round_to_nearest_even_and_widen_back() -> None:
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 3.14159, 0.0], np.float32)
    back = widen_bf16(np, bf16_bits(x))
    np.testing.assert_array_equal(back[:4], [1.0, 1.0, 1.0 + 2**-6, -2.5])  # ties to even
    assert abs(back[4] - x[4]) <= 2**-8 * abs(x[4]) and back[5] == 0.0


class Counting(ArrayScanBackend):
    """Counts the host <-> array-module transfers of a search."""

    name: ClassVar[str] = "counting"
    up = 0
    down = 0

    def _to_device(self, x: np.ndarray) -> Any:
        Counting.up += 1
        return super()._to_device(x)

    def _to_host(self, x: Any) -> np.ndarray:
        Counting.down += 1
        return super()._to_host(x)


def test_a_search_sends_queries_once_and_fetches_results_once() -> None:
    corpus = random_rows(5000, LAYOUT, 1)
    engine = Counting(corpus, LAYOUT, precision="float16", chunk_rows=512)  # ten chunks
    Counting.up = Counting.down = 0
    res = engine.search(random_rows(8, LAYOUT, 2), np.array([1.0, 0.5, 0.2]), 10)
    assert engine.rescans == 0
    assert (Counting.up, Counting.down) == (2, 4)  # queries + weights; flags, rows, scores, sub
    np.testing.assert_array_equal(
        res.rows, reference_topk(random_rows(8, LAYOUT, 2), corpus, np.array([1.0, 0.5, 0.2]), LAYOUT, 10)[0]
    )


@pytest.mark.parametrize("name", ARRAY_ENGINES)
@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16"])
def test_large_k_and_k_beyond_the_corpus(make_engine, name: str, precision: str) -> None:
    corpus = random_rows(3000, LAYOUT, 3)
    queries = random_rows(3, LAYOUT, 4)
    w = np.random.default_rng(5).uniform(0, 2, (3, 3))
    engine = make_engine(name, corpus, LAYOUT, precision=precision, chunk_rows=700)
    for k in (2048, 2999, 5000):
        res = engine.search(queries, w, k)
        np.testing.assert_array_equal(res.rows, reference_topk(queries, corpus, w, LAYOUT, min(k, 3000))[0])


@pytest.mark.parametrize("name", ARRAY_ENGINES)
def test_float16_queries_stay_exact_for_tiny_weights_and_huge_values(make_engine, name: str) -> None:
    """Per-row scaling by max_k w_k |q_k|: 1e-9 weights do not flush the query to zero in
    float16 and 1e4-sized query values do not overflow it; the bound covers subnormals."""
    corpus = random_rows(2000, LAYOUT, 6)
    queries = random_rows(4, LAYOUT, 7)
    queries[1] *= 1e4  # not block-normalised: the engine must not care
    w = np.array([[1e-9, 3e-9, 1e-10], [1.0, 0.5, 0.25], [1e-7, 1.0, 1e-12], [0.0, 0.0, 1e-30]])
    engine = make_engine(name, corpus, LAYOUT, precision="float16", chunk_rows=300)
    res = engine.search(queries, w, 10)
    np.testing.assert_array_equal(res.rows, reference_topk(queries, corpus, w, LAYOUT, 10)[0])


@pytest.mark.parametrize("name", ARRAY_ENGINES)
def test_all_zero_weights_return_the_first_rows(make_engine, name: str) -> None:
    corpus = random_rows(400, LAYOUT, 8)
    res = make_engine(name, corpus, LAYOUT, precision="float16").search(random_rows(2, LAYOUT, 9), np.zeros(3), 5)
    np.testing.assert_array_equal(res.rows, np.broadcast_to(np.arange(5), (2, 5)))
    assert (res.scores == 0).all()


def test_float16_storage_refuses_values_it_cannot_hold(make_engine) -> None:
    huge = random_rows(50, LAYOUT, 10) * 40000
    with pytest.raises(EngineInputError, match="too large for float16") as err:
        make_engine(CupyOnNumpy.name, huge, LAYOUT, precision="float16")
    assert err.value.field == "corpus"
    res = make_engine(CupyOnNumpy.name, huge, LAYOUT, precision="float32").search(huge[:2], np.ones(3), 3)
    np.testing.assert_array_equal(res.rows[:, 0], [0, 1])


def test_the_gpu_numerics_use_float16_products_and_torch_selection(make_engine) -> None:
    engine = make_engine(CupyOnNumpy.name, random_rows(100, LAYOUT, 11), LAYOUT, precision="float16")
    assert engine.selection == "torch.topk" and engine._lowp_products(1)
    prepared = engine._prepare(np.ones((2, LAYOUT.dim), np.float32))
    assert prepared.dtype == np.float16 and engine._gemm(prepared, 0, 10).dtype == np.float16
    # the bound of a float16 product is wider than that of a float32 one (query and score rounding)
    ref = make_engine(ArrayScanBackend.name, random_rows(100, LAYOUT, 11), LAYOUT, precision="float16")
    assert engine._scan_rel_error(1) > ref._scan_rel_error(1)
