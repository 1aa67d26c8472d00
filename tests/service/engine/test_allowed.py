"""Every backend, given an allowed-rows mask, returns the float64 brute-force top k among those rows."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.service.engine import EngineInputError
from esp_retrieval.subspace.scoring import reference_scores
from tests.service.engine.conftest import IDS, STARTABLE, layout_of, random_rows

N = 1200


def masked_reference(queries, corpus, weights, layout, *, mask, k):
    s = reference_scores(queries, corpus, weights, layout)
    s = np.where(mask[None, :], s, -np.inf)
    kk = min(k, int(mask.sum()))
    order = np.argsort(-s, axis=1, kind="stable")[:, :kk]
    return order, np.take_along_axis(s, order, 1)


def masks(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    one = np.zeros(n, bool)
    one[n // 3] = True
    return {
        "none": np.zeros(n, bool),
        "one": one,
        "sparse": rng.random(n) < 0.02,
        "quarter": rng.random(n) < 0.25,
        "most": rng.random(n) < 0.9,
        "all": np.ones(n, bool),
        "block": np.arange(n) >= n - 300,
    }


@pytest.mark.parametrize(("backend", "precision"), STARTABLE, ids=IDS)
def test_masked_topk_matches_masked_brute_force(make_engine, backend: str, precision: str) -> None:
    layout = layout_of("three")
    corpus = random_rows(N, layout, seed=21)
    queries = random_rows(5, layout, seed=22)
    weights = np.random.default_rng(23).uniform(0.0, 2.0, (5, len(layout)))
    weights[1] = [0.0, 1.0, 0.0]
    engine = make_engine(backend, corpus, layout, precision=precision, threads=2, chunk_rows=128)
    for name, mask in masks(N).items():
        for k in (1, 10, 1000):
            res = engine.search(queries, weights, k, allowed=mask)
            rows, scores = masked_reference(queries, corpus, weights, layout, mask=mask, k=k)
            assert res.rows.shape == (5, rows.shape[1]), (name, k)
            np.testing.assert_array_equal(res.rows, rows, err_msg=f"{name} k={k}")
            np.testing.assert_allclose(res.scores, scores, rtol=0, atol=1e-6)
            assert res.subspace_scores.shape == (5, rows.shape[1], len(layout))
            assert mask[res.rows].all()


@pytest.mark.parametrize(("backend", "precision"), STARTABLE[:1], ids=IDS[:1])
def test_a_mask_of_the_wrong_shape_names_the_argument(make_engine, backend: str, precision: str) -> None:
    layout = layout_of("one")
    corpus = random_rows(50, layout, seed=1)
    engine = make_engine(backend, corpus, layout, precision=precision)
    for bad in (np.ones(49, bool), np.ones(50, np.int64)):
        with pytest.raises(EngineInputError) as exc:
            engine.search(corpus[:1], layout.default_weights(), 3, allowed=bad)
        assert exc.value.field == "allowed"


@pytest.mark.parametrize(("backend", "precision"), STARTABLE, ids=IDS)
def test_no_mask_is_the_unfiltered_search(make_engine, backend: str, precision: str) -> None:
    layout = layout_of("three")
    corpus = random_rows(300, layout, seed=5)
    queries = random_rows(2, layout, seed=6)
    engine = make_engine(backend, corpus, layout, precision=precision)
    w = layout.default_weights()
    a = engine.search(queries, w, 10)
    b = engine.search(queries, w, 10, allowed=np.ones(300, bool))
    np.testing.assert_array_equal(a.rows, b.rows)
