"""Every backend that starts here returns exactly the float64 brute-force top k."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.subspace.scoring import reference_scores
from tests.service.engine.conftest import (
    IDS,
    LAYOUTS,
    STARTABLE,
    layout_of,
    random_rows,
    reference_topk,
    tied_corpus,
)

N = 1500


def test_the_cpu_backends_start_here() -> None:
    names = {b for b, _ in STARTABLE}
    assert {"numpy", "torch", "faiss"} <= names
    assert ("torch", "bfloat16") in STARTABLE and ("numpy", "float16") in STARTABLE


@pytest.mark.parametrize(("backend", "precision"), STARTABLE, ids=IDS)
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_matches_float64_reference(make_engine, backend: str, precision: str, layout_name: str) -> None:
    layout = layout_of(layout_name)
    corpus = random_rows(N, layout, seed=1)
    queries = random_rows(7, layout, seed=2)
    rng = np.random.default_rng(3)
    weights = rng.uniform(0.0, 2.0, (7, len(layout)))  # one weight vector per row
    weights[0] = 0.0
    weights[0, 0] = 1.0  # a row that only looks at the first block
    # small chunks: many chunks per worker, two workers, merges across both
    engine = make_engine(backend, corpus, layout, precision=precision, threads=2, chunk_rows=128)
    for k in (1, 10, 1000, N + 5):
        res = engine.search(queries, weights, k)
        rows, scores = reference_topk(queries, corpus, weights, layout, min(k, N))
        assert res.rows.shape == res.scores.shape == (7, min(k, N))
        assert res.rows.dtype == np.int64 and res.scores.dtype == np.float32
        np.testing.assert_array_equal(res.rows, rows, err_msg=f"k={k}")
        np.testing.assert_allclose(res.scores, scores, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("backend", "precision"), STARTABLE, ids=IDS)
def test_shared_weights_and_single_query(make_engine, backend: str, precision: str) -> None:
    layout = layout_of("three")
    corpus = random_rows(700, layout, seed=4)
    queries = random_rows(3, layout, seed=5)
    w = np.array([0.5, 1.0, 0.25])
    engine = make_engine(backend, corpus, layout, precision=precision, threads=1)
    res = engine.search(queries, w, 10)
    np.testing.assert_array_equal(res.rows, reference_topk(queries, corpus, w, layout, 10)[0])
    one = engine.search(queries[1:2], w, 10)  # nq == 1 takes the matrix-vector path
    np.testing.assert_array_equal(one.rows[0], res.rows[1])


@pytest.mark.parametrize(("backend", "precision"), STARTABLE, ids=IDS)
def test_ties_at_the_cut_go_to_the_lower_row(make_engine, backend: str, precision: str) -> None:
    """Exact ties everywhere: entries in {0, +-1/2} and power-of-two weights add up exactly.

    Each block has four entries of +-1/2 (norm 1), drawn from few patterns, so many rows are
    duplicates and the k-th score is shared by rows on both sides of the cut.
    """
    layout, corpus, queries, weights = tied_corpus()
    engine = make_engine(backend, corpus, layout, precision=precision, threads=2, chunk_rows=100)
    for k in (1, 10, 100, 1000):
        rows, scores = reference_topk(queries, corpus, weights, layout, min(k, 900))
        res = engine.search(queries, weights, k)
        full = reference_scores(queries, corpus, weights, layout)
        kth = scores[:, -1:]
        if k < 900:  # the cut really falls inside a tie: equal scores on both sides of it
            assert ((full == kth).sum(1) > (scores == kth).sum(1)).all()
        np.testing.assert_array_equal(res.rows, rows, err_msg=f"k={k}")
        np.testing.assert_array_equal(res.scores, scores.astype(np.float32))


@pytest.mark.parametrize(("backend", "precision"), STARTABLE, ids=IDS)
def test_subspace_scores_are_the_hits_block_cosines(make_engine, backend: str, precision: str) -> None:
    layout = layout_of("uneven")
    corpus = random_rows(300, layout, seed=7)
    queries = random_rows(4, layout, seed=8)
    weights = np.array([1.0, 0.5, 2.0, 0.0])
    res = make_engine(backend, corpus, layout, precision=precision).search(queries, weights, 5)
    assert res.subspace_scores.shape == (4, 5, 4) and res.subspace_scores.dtype == np.float32
    for qi in range(4):
        for j, row in enumerate(res.rows[qi]):
            for b, obj in enumerate(layout):
                sl = slice(obj.offset, obj.end)
                cos = float(np.dot(queries[qi, sl].astype(np.float64), corpus[row, sl]))
                assert res.subspace_scores[qi, j, b] == pytest.approx(cos, abs=1e-6)
    # the weighted score is the weighted sum of the per-block cosines
    np.testing.assert_allclose(res.scores, res.subspace_scores @ weights, atol=1e-5)
