"""Low precision: how much the scan alone loses (measured), and that the re-rank restores exactness."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.subspace.scoring import normalize_blocks
from tests.service.engine.conftest import STARTABLE, layout_of, random_rows, reference_topk

LOWP = [(b, p) for b, p in STARTABLE if p != "float32"]
LAYOUT = layout_of("three")


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return sum(len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True)) / truth.size


def near_duplicates(seed: int) -> np.ndarray:
    """8 groups of 150 rows that differ by ~1e-3: closer than bf16/fp16 storage can tell apart.

    A group is larger than the first candidate set (``k + 64``), so the scan cannot settle it.
    """
    rng = np.random.default_rng(seed)
    base = random_rows(8, LAYOUT, seed)
    rows = np.repeat(base, 150, axis=0) + 1e-3 * rng.standard_normal((1200, LAYOUT.dim)).astype(np.float32)
    return normalize_blocks(rows, LAYOUT)


@pytest.mark.parametrize(("backend", "precision"), LOWP, ids=[f"{b}-{p}" for b, p in LOWP])
def test_low_precision_scan_recall_on_random_data(make_engine, backend: str, precision: str) -> None:
    corpus = random_rows(3000, LAYOUT, seed=31)
    queries = random_rows(32, LAYOUT, seed=32)
    w = np.array([1.0, 0.6, 0.3])
    truth = reference_topk(queries, corpus, w, LAYOUT, 10)[0]
    engine = make_engine(backend, corpus, LAYOUT, precision=precision, chunk_rows=256)
    scaled = (queries * LAYOUT.expand(w)).astype(np.float32)
    scan_rows, _ = engine._scan(scaled, 10)  # the low-precision scan alone
    scan_recall = recall(scan_rows[:, :10], truth)
    assert scan_recall >= 0.9  # measured: well separated random data survives low precision
    res = engine.search(queries, w, 10)
    assert recall(res.rows, truth) == 1.0
    np.testing.assert_array_equal(res.rows, truth)


@pytest.mark.parametrize(("backend", "precision"), LOWP, ids=[f"{b}-{p}" for b, p in LOWP])
def test_re_rank_is_exact_where_low_precision_cannot_rank(make_engine, backend: str, precision: str) -> None:
    corpus = near_duplicates(33)
    queries = normalize_blocks(corpus[::150] + 1e-3, LAYOUT)  # one query near each group
    w = np.array([1.0, 1.0, 1.0])
    truth = reference_topk(queries, corpus, w, LAYOUT, 10)[0]
    engine = make_engine(backend, corpus, LAYOUT, precision=precision, chunk_rows=128)
    scaled = (queries * LAYOUT.expand(w)).astype(np.float32)
    scan_recall = recall(engine._scan(scaled, 10)[0][:, :10], truth)
    assert scan_recall < 1.0  # measured: the scan alone cannot order near-duplicates
    res = engine.search(queries, w, 10)
    np.testing.assert_array_equal(res.rows, truth)
    assert engine.rescans > 0  # the completeness check widened the candidate set
