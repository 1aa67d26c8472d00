"""A sparse BM25 block beside the dense ones: every backend that declares ``capabilities.sparse``
returns the float64 brute force ``sum_k w_k cos_k + sum_s w_s sparse_s`` (ties to the lower row),
the others refuse it, naming the field."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.service.engine import (
    BackendUnavailable,
    EngineInputError,
    SparseQuery,
    SparseUnsupportedError,
)
from esp_retrieval.subspace.engine.base import Backend
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import reference_scores
from esp_retrieval.subspace.sparse import SparseLexical
from tests.service.engine.conftest import ENGINES, STARTABLE, layout_of, random_rows

PASSAGES = Path(__file__).resolve().parents[3] / "data" / "trec-dl-2019-2020-passage" / "corpus.tsv.gz"
N = 300
QUERIES = [
    "how long is life cycle of flea",  # TREC DL queries (few of their words are in 300 passages)
    "definition declaratory judgment",
    "marion illinois hotels",  # words of the passages
    "beta blockers propranolol",
    "fields of anthropology archaeology",
    "the of and",  # stop words only: no term
]
SPARSE_CAPABLE = [(b, p) for b, p in STARTABLE if ENGINES[b].capabilities.sparse]
IDS = [f"{b}-{p}" for b, p in SPARSE_CAPABLE]
WEIGHTS = {  # dense (K,) and the sparse weight
    "mixed": ([1.0, 0.5, 0.25], 0.8),
    "sparse-only": ([0.0, 0.0, 0.0], 1.0),
    "sparse-zero": ([1.0, 1.0, 1.0], 0.0),
    "heavy-sparse": ([0.1, 0.0, 0.3], 5.0),
}
MASKS = {
    "none": None,
    "selective": np.random.default_rng(3).random(N) < 0.1,
    "broad": np.random.default_rng(4).random(N) < 0.7,
}


@pytest.fixture(scope="module")
def bm25() -> SparseLexical:
    from esp_retrieval.training.sparse_lexical import build_bm25

    with gzip.open(PASSAGES, "rt", encoding="utf-8") as fh:
        texts = [line.rstrip("\n").split("\t", 1)[1] for line in itertools.islice(fh, N)]
    return build_bm25(texts)


@pytest.fixture(scope="module")
def data() -> tuple[SubspaceLayout, np.ndarray, np.ndarray]:
    layout = layout_of("three")
    return layout, random_rows(N, layout, 11), random_rows(len(QUERIES), layout, 12)


def brute_force(q, corpus, layout, w, *, block, sq, ws, k, allowed=None):  # type: ignore[no-untyped-def]
    """The evaluation's definition: per-block float64 cosines plus the weighted block scores."""
    total = reference_scores(q, corpus, np.broadcast_to(w, (len(q), len(w))), layout)
    total = total + np.asarray(ws, np.float64).reshape(-1, 1) * block.scores(sq)
    if allowed is not None:
        total = np.where(allowed[None, :], total, -np.inf)
        k = min(k, int(allowed.sum()))
    order = np.argsort(-total, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(total, order, 1)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize(("backend", "precision"), SPARSE_CAPABLE, ids=IDS)
def test_sparse_search_equals_brute_force(make_engine, data, bm25, backend, precision, weights, mask) -> None:  # type: ignore[no-untyped-def]  # noqa: PLR0917
    layout, corpus, q = data  # ties: among the rows no query term matches (sparse-only)
    w, ws = np.array(WEIGHTS[weights][0]), WEIGHTS[weights][1]
    engine = make_engine(backend, corpus, layout, precision=precision, sparse_blocks={"bm25": bm25})
    sq = bm25.encode(QUERIES)
    allowed = MASKS[mask]
    for k in (1, 10, N):
        res = engine.search(q, w, k, allowed=allowed, sparse={"bm25": SparseQuery(sq, ws)})
        rows, scores = brute_force(q, corpus, layout, w, block=bm25, sq=sq, ws=ws, k=k, allowed=allowed)
        np.testing.assert_array_equal(res.rows, rows, err_msg=f"k={k}")
        np.testing.assert_allclose(res.scores, scores, rtol=1e-5, atol=1e-6)
        # per-hit scores: the dense cosines, then the block's own (unweighted) score
        assert res.subspace_scores.shape == (len(q), rows.shape[1], len(layout) + 1)
        sub = res.subspace_scores.astype(np.float64)
        want = np.take_along_axis(bm25.scores(sq), rows, 1)
        np.testing.assert_allclose(sub[..., -1], want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(sub[..., :-1] @ w + ws * sub[..., -1], scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("backend", "precision"), SPARSE_CAPABLE, ids=IDS)
def test_zero_sparse_weight_is_the_dense_search(make_engine, data, bm25, backend, precision) -> None:  # type: ignore[no-untyped-def]
    layout, corpus, q = data
    w = np.array([1.0, 0.5, 2.0])
    engine = make_engine(backend, corpus, layout, precision=precision, sparse_blocks={"bm25": bm25})
    dense = engine.search(q, w, 10)
    both = engine.search(q, w, 10, sparse={"bm25": (bm25.encode(QUERIES), 0.0)})
    np.testing.assert_array_equal(both.rows, dense.rows)
    np.testing.assert_array_equal(both.scores, dense.scores)
    np.testing.assert_array_equal(both.subspace_scores[..., :-1], dense.subspace_scores)


@pytest.mark.parametrize(("backend", "precision"), SPARSE_CAPABLE, ids=IDS)
def test_per_query_sparse_weights_and_two_blocks(make_engine, data, bm25, backend, precision) -> None:  # type: ignore[no-untyped-def]
    """A weight per query row, like the dense ``(nq, K)`` weights; two named blocks add up."""
    layout, corpus, q = data
    w = np.array([0.5, 1.0, 0.0])
    ws = np.linspace(0.0, 2.0, len(QUERIES))
    blocks = {"bm25": bm25, "again": bm25}
    engine = make_engine(backend, corpus, layout, precision=precision, sparse_blocks=blocks)
    sq = bm25.encode(QUERIES)
    res = engine.search(q, w, 10, sparse={"again": SparseQuery(sq, 0.5 * ws), "bm25": SparseQuery(sq, ws)})
    rows, scores = brute_force(q, corpus, layout, w, block=bm25, sq=sq, ws=1.5 * ws, k=10)
    np.testing.assert_array_equal(res.rows, rows)
    np.testing.assert_allclose(res.scores, scores, rtol=1e-5, atol=1e-6)
    assert res.subspace_scores.shape[-1] == len(layout) + 2


def test_the_scan_adds_the_sparse_term(make_engine, data, bm25) -> None:  # type: ignore[no-untyped-def]
    """A row with no dense score enters through its sparse score alone: the scan ranks the sum."""
    layout, corpus, q = data
    sq = bm25.encode(QUERIES)
    best = np.argmax(bm25.scores(sq), axis=1)
    engine = make_engine("numpy", corpus, layout, sparse_blocks={"bm25": bm25})
    matched = bm25.scores(sq).max(axis=1) > 0
    res = engine.search(q[matched], np.zeros(len(layout)), 1, sparse={"bm25": (sq[matched], 1.0)})
    np.testing.assert_array_equal(res.rows[:, 0], best[matched])
    assert engine.rescans == 0  # the scan's own candidates held it: no row is all-tied


@pytest.mark.parametrize("name", [n for n, cls in ENGINES.items() if not cls.capabilities.sparse])
def test_a_backend_without_the_capability_refuses(name: str, data, bm25) -> None:  # type: ignore[no-untyped-def]
    """It does not start with sparse blocks (the fallback chain logs why) and refuses a sparse search."""
    layout, corpus, q = data
    with pytest.raises((BackendUnavailable, ImportError)) as info:
        ENGINES[name](corpus, layout, sparse_blocks={"bm25": bm25})
    if info.type is BackendUnavailable and "sparse" not in str(info.value):  # could not start at all
        pytest.skip(str(info.value))
    try:
        engine: Backend = ENGINES[name](corpus, layout)
    except (BackendUnavailable, ImportError) as exc:
        pytest.skip(str(exc))
    try:
        with pytest.raises(SparseUnsupportedError) as refused:
            engine.search(q, np.ones(len(layout)), 5, sparse={"bm25": (bm25.encode(QUERIES), 1.0)})
        assert refused.value.field == "sparse" and name in refused.value.message
        assert isinstance(refused.value, EngineInputError)
    finally:
        engine.close()


def test_bad_sparse_input_names_the_field(make_engine, data, bm25) -> None:  # type: ignore[no-untyped-def]
    layout, corpus, q = data
    engine = make_engine("numpy", corpus, layout, sparse_blocks={"bm25": bm25})
    sq, w = bm25.encode(QUERIES), np.ones(len(layout))
    cases = {
        "sparse.other": {"other": (sq, 1.0)},
        "sparse.bm25.vectors": {"bm25": (sq[:2], 1.0)},
        "sparse.bm25.weight": {"bm25": (sq, -1.0)},
    }
    for field, arg in cases.items():
        with pytest.raises(EngineInputError) as info:
            engine.search(q, w, 3, sparse=arg)
        assert info.value.field == field
    with pytest.raises(EngineInputError) as info:
        make_engine("numpy", corpus[:10], layout, sparse_blocks={"bm25": bm25})
    assert info.value.field == "sparse_blocks.bm25"


def test_the_engine_ranks_as_the_evaluation_does(make_engine, data, bm25) -> None:  # type: ignore[no-untyped-def]
    """The evaluation's exact sum (``esp_retrieval.training.evaluate.retrieval``) is the reference it will switch from."""
    from esp_retrieval.training.evaluate.retrieval import _sweep_rows_with_sparse

    layout, corpus, q = data
    sq = bm25.encode(QUERIES)
    engine = make_engine("numpy", corpus, layout, sparse_blocks={"bm25": bm25})
    sweep = [
        {"semantic": 1.0, "entity": 0.0, "intent": 0.5, "bm25": 0.7},
        {"semantic": 0.0, "entity": 0.0, "intent": 0.0},
    ]
    want = _sweep_rows_with_sparse(q, corpus, layout, sweep=sweep, sparse={"bm25": bm25.scores(sq)}, k=10)
    for point, rows in zip(sweep, want, strict=True):
        w = np.array([point[n] for n in layout.names])
        got = engine.search(q, w, 10, sparse={"bm25": (sq, point.get("bm25", 1.0))})
        np.testing.assert_array_equal(got.rows, rows)


def test_the_fallback_chain_skips_a_backend_without_the_capability(data, bm25, caplog) -> None:  # type: ignore[no-untyped-def]
    from esp_retrieval.service.engine import create_engine

    layout, corpus, _ = data
    engine = create_engine("faiss", corpus, layout, fallback=["numpy"], sparse_blocks={"bm25": bm25})
    try:
        assert engine.name == "numpy" and engine.sparse_blocks is not None
        assert "faiss: cannot score sparse blocks" in caplog.text
    finally:
        engine.close()
