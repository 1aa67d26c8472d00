"""Candidates that cannot reach the top k are dropped before the exact re-rank, and only those."""

from __future__ import annotations

import numpy as np

from esp_retrieval.subspace.engine.refine import prune
from tests.service.engine.conftest import layout_of, random_rows, reference_topk


def test_prune_keeps_the_band_within_two_eps_of_the_kth_scan_score() -> None:
    scan = np.array([[0.9, 0.8, 0.7, 0.69, 0.5, 0.1], [0.9, 0.85, 0.2, 0.1, -np.inf, -np.inf]], np.float32)
    rows = np.array([[5, 4, 3, 2, 1, 0], [7, 8, 9, 6, -1, -1]])
    eps = np.array([0.01, 0.5])
    kept = prune(np, rows, scan, 2, eps, trim=True)
    # query 0: cut = 0.8 - 0.02, so only rows 5 and 4 stay; query 1: cut = 0.85 - 1.0 keeps all four
    np.testing.assert_array_equal(kept, [[5, 4, -1, -1], [7, 8, 9, 6]])


def test_pruned_search_still_equals_the_float64_reference(make_engine) -> None:
    """Low precision keeps k + 64 candidates; pruning re-ranks only the band, results unchanged."""
    layout = layout_of("three")
    corpus = random_rows(3000, layout, seed=51)
    queries = random_rows(16, layout, seed=52)
    w = np.array([1.0, 0.5, 0.25])
    engine = make_engine("numpy", corpus, layout, precision="float16", chunk_rows=256)
    scaled = (queries * layout.expand(w)).astype(np.float32)
    rows, scan = engine._scan(scaled, engine.candidates(10))
    scale = np.full(16, w.sum())  # block norms are 1: sum_k w_k |q_k| |d_k| = sum_k w_k
    pruned = prune(np, rows, scan, 10, engine._scan_rel_error(16) * scale, trim=True)
    assert (pruned >= 0).sum() < (rows >= 0).sum()  # measured: well-separated rows leave the band
    truth = reference_topk(queries, corpus, w, layout, 10)[0]
    for kept, want in zip(pruned, truth, strict=True):
        assert set(want) <= set(kept[kept >= 0])
    np.testing.assert_array_equal(engine.search(queries, w, 10).rows, truth)
