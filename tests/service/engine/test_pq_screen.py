"""The ``pq`` backend: a 4-bit product-quantised screen, exact float64 re-rank of what it screens.

Exact whenever the screen holds every row (with sparse blocks and row masks), the hits always
carry their exact scores, a row found only by its sparse score is not lost to the dense screen
(nor to the ``ivf`` probing in its approximate mode), and the screen's settings are checked."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from esp_retrieval.service.engine import EngineInputError, SparseQuery
from esp_retrieval.subspace.engine.pq_screen import PqScreenBackend
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores
from esp_retrieval.subspace.sparse import SparseLexical
from tests.service.engine.conftest import ENGINES, layout_of, random_rows, reference_topk

PASSAGES = Path(__file__).resolve().parents[3] / "data" / "trec-dl-2019-2020-passage" / "corpus.tsv.gz"
N = 300
QUERIES = ["marion illinois hotels", "beta blockers propranolol", "fields of anthropology", "the of and"]


@pytest.fixture(scope="module")
def bm25() -> SparseLexical:
    from esp_retrieval.training.sparse_lexical import build_bm25

    with gzip.open(PASSAGES, "rt", encoding="utf-8") as fh:
        texts = [line.rstrip("\n").split("\t", 1)[1] for line in itertools.islice(fh, N)]
    return build_bm25(texts)


def brute_force(q, corpus, layout, w, block, sq, ws, k, allowed=None):  # type: ignore[no-untyped-def]  # noqa: PLR0917
    total = reference_scores(q, corpus, np.broadcast_to(w, (len(q), len(w))), layout)
    total = total + ws * block.scores(sq)
    if allowed is not None:
        total = np.where(allowed[None, :], total, -np.inf)
        k = min(k, int(allowed.sum()))
    order = np.argsort(-total, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(total, order, 1)


def clustered(n: int, layout: SubspaceLayout, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, layout.dim))
    rows = centres[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, layout.dim))
    return normalize_blocks(rows.astype(np.float32), layout)


@pytest.mark.parametrize("mask", ["none", "broad", "selective"])
@pytest.mark.parametrize(("w", "ws"), [([1.0, 0.5, 0.25], 0.8), ([0.0, 0.0, 0.0], 1.0), ([0.1, 0.0, 0.3], 5.0)])
def test_a_screen_of_every_row_is_the_exact_search(bm25, w, ws, mask) -> None:  # type: ignore[no-untyped-def]
    layout = layout_of("three")
    corpus, q = random_rows(N, layout, 11), random_rows(len(QUERIES), layout, 12)
    allowed = {"none": None, "broad": np.random.default_rng(4).random(N) < 0.7,
               "selective": np.random.default_rng(3).random(N) < 0.1}[mask]
    engine = PqScreenBackend(corpus, layout, screen=N, exact_below=0, sparse_blocks={"bm25": bm25})
    assert engine.fallback is None and engine.shards
    sq = bm25.encode(QUERIES)
    for k in (1, 10):
        res = engine.search(q, np.array(w), k, allowed=allowed, sparse={"bm25": SparseQuery(sq, ws)})
        rows, scores = brute_force(q, corpus, layout, np.array(w), bm25, sq, ws, k, allowed)
        np.testing.assert_array_equal(res.rows, rows)
        np.testing.assert_allclose(res.scores, scores, rtol=1e-5, atol=1e-6)


def test_a_small_screen_finds_most_of_the_top_k_and_scores_them_exactly() -> None:
    layout = layout_of("three")
    corpus, q = clustered(6000, layout, 1), clustered(20, layout, 2)
    engine = PqScreenBackend(corpus, layout, screen=300, exact_below=0)
    for w in ([1.0, 0.0, 0.0], [0.2, 1.0, 0.5], [0.0, 0.0, 1.0]):
        res = engine.search(q, np.array(w), 10)
        truth, _ = reference_topk(q, corpus, np.array(w), layout, 10)
        found = sum(len(set(a) & set(b)) for a, b in zip(res.rows.tolist(), truth.tolist(), strict=True))
        assert found / truth.size >= 0.8, w  # 5% of the rows screened
        exact = reference_scores(q, corpus, np.broadcast_to(w, (len(q), 3)), layout)
        np.testing.assert_allclose(res.scores, np.take_along_axis(exact, res.rows, 1), rtol=1e-5, atol=1e-6)
    # the screen is a screen: its candidates are a small part of the corpus
    rows, _ = engine._screen(np.ascontiguousarray(q * layout.expand(np.ones(3)), np.float32), 300, None, None)
    assert ((rows >= 0).sum(axis=1) <= 300).all()


@pytest.mark.parametrize(
    ("name", "kw"), [("pq", {"screen": 10}), ("ivf", {"max_touched": 0.02, "first_fraction": 0.01})]
)
def test_an_approximate_search_keeps_a_row_found_only_by_its_sparse_score(name, kw, bm25) -> None:  # type: ignore[no-untyped-def]
    layout = layout_of("three")
    corpus, q = random_rows(N, layout, 11), random_rows(len(QUERIES), layout, 12)
    engine = ENGINES[name](corpus, layout, exact_below=0, sparse_blocks={"bm25": bm25}, **kw)
    sq = bm25.encode(QUERIES)
    w, ws = np.array([0.05, 0.0, 0.0]), 5.0  # the sparse score decides; the dense screen cannot see it
    res = engine.search(q, w, 3, sparse={"bm25": SparseQuery(sq, ws)})
    rows, _ = brute_force(q, corpus, layout, w, bm25, sq, ws, 3)
    matched = (bm25.scores(sq) > 0).sum(axis=1) >= 3
    assert matched.any()
    np.testing.assert_array_equal(res.rows[matched], rows[matched])


def test_settings_are_checked_and_a_small_corpus_takes_the_exact_scan(caplog) -> None:  # type: ignore[no-untyped-def]
    layout = layout_of("uneven")  # widths 3, 17, 1, 9: no dsub > 1 divides them all
    corpus = random_rows(500, layout, 0)
    with pytest.raises(EngineInputError) as err:
        PqScreenBackend(corpus, layout, exact_below=0)
    assert err.value.field == "dsub"
    for bad in ({"screen": 0}, {"dsub": 1.5}, {"exact_below": -1}):
        with pytest.raises(EngineInputError):
            PqScreenBackend(corpus, layout, **bad)  # type: ignore[arg-type]
    with caplog.at_level("INFO"):
        small = PqScreenBackend(corpus, layout)  # 500 rows < exact_below: no screen is built
    assert not small.shards and small.fallback is not None and "exact scan" in caplog.text
    q = random_rows(3, layout, 1)
    w = np.array([1.0, 0.5, 2.0, 0.0])
    truth, _ = reference_topk(q, corpus, w, layout, 5)
    np.testing.assert_array_equal(small.search(q, w, 5).rows, truth)
    one = PqScreenBackend(corpus, layout, dsub=1, exact_below=0, screen=500)  # dsub 1 fits any layout
    np.testing.assert_array_equal(one.search(q, w, 5).rows, truth)


def test_a_sharded_screen_answers_like_one_screen() -> None:
    """Shards share one codebook, so their merged top rows are the single screen's: one query
    (shards searched in threads) and a batch (one after another) give the same hits."""
    layout = layout_of("three")
    corpus, q = clustered(5000, layout, 3), clustered(6, layout, 4)
    one = PqScreenBackend(corpus, layout, screen=200, exact_below=0, threads=1)
    three = PqScreenBackend(corpus, layout, screen=200, exact_below=0, threads=3)
    assert len(one.shards) == 1 and len(three.shards) == 3
    assert sum(int(s.ntotal) for s in three.shards) == len(corpus)
    w = np.array([0.2, 1.0, 0.5])
    batch = three.search(q, w, 10)
    np.testing.assert_array_equal(batch.rows, one.search(q, w, 10).rows)
    for i in range(len(q)):
        np.testing.assert_array_equal(three.search(q[i : i + 1], w, 10).rows[0], batch.rows[i])
    three.close()


def lexical_rows(n: int, layout: SubspaceLayout, seed: int, nnz: int = 2) -> np.ndarray:
    """Clustered dense rows whose ``entity`` block is sparse (``nnz`` hashed buckets per row),
    as the lexical entity block of a bundle is."""
    rng = np.random.default_rng(seed)
    rows = clustered(n, layout, seed)
    ent = layout["entity"]
    sparse = np.zeros((n, ent.dim), np.float32)
    for i in range(n):
        sparse[i, rng.choice(ent.dim, nnz, replace=False)] = rng.random(nnz) + 0.1
    rows[:, ent.offset : ent.end] = sparse
    return normalize_blocks(rows, layout)


def test_a_sparse_block_is_scored_from_posting_lists_exactly_beside_the_screen() -> None:
    """The entity block (2 of 12 columns per row) is not quantised but posted: a weight on it
    alone is answered exactly by a small screen, a mixed weight finds the top k, and a screen of
    every row is the exact search; ``posting_density=0`` screens every block, as before."""
    layout = layout_of("three")
    corpus, q = lexical_rows(4000, layout, 5), lexical_rows(12, layout, 6, nnz=1)
    engine = PqScreenBackend(corpus, layout, screen=100, exact_below=0)
    assert engine.posted == ("entity",) and engine.shards[0].d == 28  # semantic 24 + intent 4
    plain = PqScreenBackend(corpus, layout, screen=100, exact_below=0, posting_density=0.0)
    assert plain.posted == () and plain.shards[0].d == layout.dim
    entity_only = np.array([0.0, 1.0, 0.0])
    truth, scores = reference_topk(q, corpus, entity_only, layout, 10)
    res = engine.search(q, entity_only, 10)
    np.testing.assert_array_equal(res.rows, truth)  # posted scores are exact: no screen error
    np.testing.assert_allclose(res.scores, scores, rtol=1e-5, atol=1e-6)
    for w in ([0.3, 1.0, 0.2], [1.0, 0.2, 0.0]):
        truth, _ = reference_topk(q, corpus, np.array(w), layout, 10)
        found = engine.search(q, np.array(w), 10).rows
        hits = sum(len(set(a) & set(b)) for a, b in zip(found.tolist(), truth.tolist(), strict=True))
        assert hits / truth.size >= 0.9, w  # 2.5% of the rows screened
    every = engine.with_screen(len(corpus))
    for w in ([0.3, 1.0, 0.2], [0.0, 0.0, 1.0]):
        truth, _ = reference_topk(q, corpus, np.array(w), layout, 5)
        np.testing.assert_array_equal(every.search(q, np.array(w), 5).rows, truth)
    with pytest.raises(EngineInputError) as err:
        PqScreenBackend(corpus, layout, exact_below=0, posting_density=1.5)
    assert err.value.field == "posting_density"


def test_posting_lists_over_several_row_chunks_are_the_transposed_block(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from esp_retrieval.subspace.engine import pq_screen

    monkeypatch.setattr(pq_screen, "_CHUNK", 1000)  # 3,500 rows: four chunks, the last short
    x = np.random.default_rng(0).random((3500, 40)).astype(np.float32)
    x[x < 0.8] = 0
    cols = np.array([3, 5, 6, 7, 20, 39])
    got = pq_screen.build_postings(x, cols)
    want = sp.csr_matrix(x[:, cols].T)
    assert got.shape == want.shape and got.has_sorted_indices
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
