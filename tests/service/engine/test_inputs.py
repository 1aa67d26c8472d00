"""Input handling: bad input names its field; corpora from disk, float16 and large batches work."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.service.engine import BackendUnavailable, EngineInputError
from tests.service.engine.conftest import layout_of, random_rows, reference_topk

LAYOUT = layout_of("three")
CORPUS = random_rows(300, LAYOUT, seed=21)
Q = random_rows(4, LAYOUT, seed=22)


@pytest.mark.parametrize(
    ("queries", "weights", "k", "field"),
    [
        (Q, np.ones(3), 0, "k"),
        (Q, np.ones(3), True, "k"),
        (Q, np.ones(3), 2.5, "k"),
        (Q[:, :-1], np.ones(3), 5, "queries"),
        (Q[0], np.ones(3), 5, "queries"),
        (np.full_like(Q, np.nan), np.ones(3), 5, "queries"),
        (Q.astype(np.int64), np.ones(3), 5, "queries"),
        (Q, np.ones(4), 5, "block_weights"),
        (Q, np.ones((3, 3)), 5, "block_weights"),
        (Q, np.array([1.0, -0.5, 1.0]), 5, "block_weights"),
        (Q, np.array([1.0, np.inf, 1.0]), 5, "block_weights"),
    ],
)
def test_bad_search_input_names_the_field(make_engine, queries, weights, k, field: str) -> None:
    engine = make_engine("numpy", CORPUS, LAYOUT)
    with pytest.raises(EngineInputError) as err:
        engine.search(queries, weights, k)
    assert err.value.field == field


def test_bad_corpus_and_settings_are_rejected(make_engine) -> None:
    bad = CORPUS.copy()
    bad[7, 3] = np.nan
    with pytest.raises(EngineInputError, match="rows 0..299 contain NaN") as err:
        make_engine("numpy", bad, LAYOUT)
    assert err.value.field == "corpus"
    with pytest.raises(EngineInputError, match="columns"):
        make_engine("numpy", CORPUS[:, :-1], LAYOUT)
    with pytest.raises(EngineInputError, match="dtype"):
        make_engine("numpy", CORPUS.astype(np.float64), LAYOUT)
    with pytest.raises(EngineInputError) as err:
        make_engine("numpy", CORPUS, LAYOUT, threads=0)
    assert err.value.field == "threads"
    with pytest.raises(BackendUnavailable, match="numpy: precision 'bfloat16'"):
        make_engine("numpy", CORPUS, LAYOUT, precision="bfloat16")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_memory_mapped_corpus_is_scanned_in_place(make_engine, backend: str, tmp_path) -> None:
    np.save(tmp_path / "emb.npy", CORPUS)
    mapped = np.load(tmp_path / "emb.npy", mmap_mode="r")
    engine = make_engine(backend, mapped, LAYOUT, chunk_rows=64)
    assert engine.master is mapped  # the float32 master is not copied into RAM
    res = engine.search(Q, np.ones(3), 10)
    np.testing.assert_array_equal(res.rows, reference_topk(Q, CORPUS, np.ones(3), LAYOUT, 10)[0])


@pytest.mark.parametrize(("backend", "precision"), [("numpy", "float32"), ("torch", "float16")])
def test_float16_corpus_is_exact_against_its_own_values(make_engine, backend: str, precision: str) -> None:
    half = CORPUS.astype(np.float16)
    engine = make_engine(backend, half, LAYOUT, precision=precision, chunk_rows=64)
    w = np.array([1.0, 0.3, 0.7])
    res = engine.search(Q, w, 25)
    np.testing.assert_array_equal(res.rows, reference_topk(Q, half, w, LAYOUT, 25)[0])


def test_batches_larger_than_one_scan_group(make_engine) -> None:
    queries = random_rows(600, LAYOUT, seed=23)  # split into groups of 512 inside the scan
    weights = np.random.default_rng(24).uniform(0, 1, (600, 3))
    engine = make_engine("numpy", CORPUS, LAYOUT, chunk_rows=100)
    res = engine.search(queries, weights, 3)
    np.testing.assert_array_equal(res.rows, reference_topk(queries, CORPUS, weights, LAYOUT, 3)[0])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_thread_count_changes_speed_not_results(make_engine, backend: str) -> None:
    w = np.array([1.0, 2.0, 0.5])
    engine = make_engine(backend, CORPUS, LAYOUT, threads=1, chunk_rows=32)
    one = engine.search(Q, w, 20)
    engine.set_threads(2)
    two = engine.search(Q, w, 20)
    np.testing.assert_array_equal(one.rows, two.rows)
    np.testing.assert_array_equal(one.scores, two.scores)


def test_all_zero_weights_tie_everything_and_return_the_first_rows(make_engine) -> None:
    res = make_engine("numpy", CORPUS, LAYOUT).search(Q, np.zeros(3), 5)
    np.testing.assert_array_equal(res.rows, np.broadcast_to(np.arange(5), (4, 5)))
    assert (res.scores == 0).all()
