"""The ``cupy`` backend on a CUDA device: the same exactness contract as the CPU backends.

Skipped without CUDA. The backend is a slot until the GPU issue implements it; on a GPU machine
this test is the contract it has to meet.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.cupy_backend import cuda_unavailable_reason
from tests.service.engine.conftest import layout_of, random_rows, reference_topk

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_unavailable_reason() is not None, reason=str(cuda_unavailable_reason())),
]


@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16"])
def test_cupy_matches_float64_reference(make_engine, precision: str) -> None:
    layout = layout_of("three")
    corpus = random_rows(5000, layout, seed=51)
    queries = random_rows(9, layout, seed=52)
    weights = np.random.default_rng(53).uniform(0, 2, (9, 3))
    engine = make_engine("cupy", corpus, layout, precision=precision)
    for k in (1, 10, 1000, 6000):
        res = engine.search(queries, weights, k)
        np.testing.assert_array_equal(
            res.rows, reference_topk(queries, corpus, weights, layout, min(k, 5000))[0]
        )
