"""The chunked scan never materialises the ``nq x N`` score matrix."""

from __future__ import annotations

import tracemalloc

import numpy as np

from tests.service.engine.conftest import layout_of, random_rows


def test_numpy_scan_working_set_is_bounded(make_engine) -> None:
    layout = layout_of("three")
    corpus = random_rows(40_000, layout, seed=41)
    queries = random_rows(64, layout, seed=42)
    engine = make_engine("numpy", corpus, layout, threads=2, chunk_rows=512)
    engine.search(queries, np.ones(3), 10)  # thread pool and first-call allocations
    full_matrix = 64 * 40_000 * 4
    tracemalloc.start()
    try:
        engine.search(queries, np.ones(3), 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < full_matrix / 8, f"peak {peak} bytes vs full score matrix {full_matrix}"
