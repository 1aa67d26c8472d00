"""The ``ivf`` backend where the index cannot win: the exact scan answers, like numpy."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from esp_retrieval.subspace.engine.ivf import EXACT_BELOW, IvfBackend
from tests.service.engine.conftest import layout_of, random_rows


def test_below_exact_below_the_exact_scan_answers_like_numpy(make_engine, caplog) -> None:
    layout = layout_of("three")
    corpus = random_rows(3000, layout, seed=1)
    queries = random_rows(7, layout, seed=2)
    w = np.random.default_rng(3).uniform(0.0, 1.0, (7, 3))
    exact = make_engine("numpy", corpus, layout)
    with caplog.at_level(logging.INFO, logger="esp_retrieval.subspace.engine.ivf"):
        engine = make_engine("ivf", corpus, layout, max_touched=0.05)
    assert engine.fallback == f"3000 rows < exact_below {EXACT_BELOW}"
    assert sum("exact scan answers every query" in r.getMessage() for r in caplog.records) == 1
    mask = np.random.default_rng(4).random(len(corpus)) < 0.6
    for allowed in (None, mask, mask & (np.arange(len(corpus)) < 300)):  # none, broad, selective
        got = engine.search(queries, w, 10, allowed=allowed)
        want = exact.search(queries, w, 10, allowed=allowed)
        np.testing.assert_array_equal(got.rows, want.rows)
        np.testing.assert_array_equal(got.scores, want.scores)
        np.testing.assert_array_equal(got.subspace_scores, want.subspace_scores)
        stats = engine.last_stats
        assert stats.mode == "exact" and stats.exact.all() and (stats.touched == len(corpus)).all()


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"max_touched": 0.05}, "1200 rows < exact_below 5000"),
        ({"max_touched": 0.5, "exact_below": 0}, "max_touched 0.5 >= exact_above 0.5"),
        ({"max_touched": 0.05, "exact_below": 1000}, None),  # large enough: the index
        ({"exact_below": 5000}, None),  # exact mode (no max_touched): the probing is exact anyway
    ],
)
def test_the_fallback_decision(make_engine, kw: dict, reason: str | None) -> None:
    layout = layout_of("three")
    corpus = random_rows(1200, layout, seed=5)
    engine = make_engine("ivf", corpus, layout, **{"exact_below": 5000, **kw})
    assert engine.fallback == reason
    engine.search(random_rows(3, layout, seed=6), np.array([1.0, 0.5, 0.2]), 5)
    assert engine.last_stats.mode == ("ivf" if reason is None else "exact")


def test_exact_below_is_checked() -> None:
    layout = layout_of("three")
    with pytest.raises(Exception, match="exact_below"):
        IvfBackend(random_rows(50, layout, seed=0), layout, exact_below=-1)


def test_the_service_builds_no_index_the_backend_would_not_use(tmp_path, make_engine) -> None:
    from types import SimpleNamespace

    from esp_retrieval.service.engine.ann import ivf_options

    layout = layout_of("three")
    corpus = random_rows(800, layout, seed=9)
    bundle = SimpleNamespace(path=tmp_path, embeddings=corpus, layout=layout)  # no ann/ folder
    opts = ivf_options(bundle, 0.05)  # type: ignore[arg-type]
    assert opts == {"max_touched": 0.05}
    engine = make_engine("ivf", corpus, layout, **opts)
    assert engine.fallback is not None and not hasattr(engine, "index")
