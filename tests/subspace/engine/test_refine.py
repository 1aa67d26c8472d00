"""The one refine loop: a backend that supplies only a scan gets the float64 brute-force top k.

The scans here are deliberately bare (a full matrix product and a sort), one of them in
float16 so that the completeness check must rescan; everything else (scaling, the bound,
completion, masks, the exact re-rank, per-subspace scores) is :class:`Backend`'s.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import scipy.sparse as sp

from esp_retrieval.subspace.engine.base import Backend, Capabilities
from esp_retrieval.subspace.engine.refine import Batch, Candidates, Filter, RowTable, scan_bound, stack_rows
from esp_retrieval.subspace.engine.sparse_terms import SparseQuery, SparseScan
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores
from esp_retrieval.subspace.sparse import SparseLexical

LAYOUT = SubspaceLayout.from_dims({"a": 6, "b": 10, "c": 3})


class ScanOnly(Backend):
    """A full product and a sort: the least a backend can supply."""

    name: ClassVar[str] = "scan-only"
    capabilities: ClassVar[Capabilities] = Capabilities(sparse=True)
    scans: ClassVar[list[int]] = []

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        ScanOnly.scans.append(c)
        scores = scaled @ np.asarray(self.master, np.float32).T
        if sparse is not None:
            sparse.add(scores, 0, self.num_docs)
        rows = np.argsort(-scores, axis=1, kind="stable")[:, :c]
        return rows, np.take_along_axis(scores, rows, 1).astype(np.float32)


class Float16Scan(ScanOnly):
    """The same, from a float16 copy with float16 queries: the bound must widen the candidates."""

    name: ClassVar[str] = "float16-scan"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16")

    def _lowp_products(self, nq: int) -> bool:
        return True

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        scores = (scaled.astype(np.float16) @ self.master.astype(np.float16).T).astype(np.float32)
        if sparse is not None:
            sparse.add(scores, 0, self.num_docs)
        rows = np.argsort(-scores, axis=1, kind="stable")[:, :c]
        return rows, np.take_along_axis(scores, rows, 1)


class OwnCandidates(ScanOnly):
    """An approximate generator: a fixed half of the corpus, vectors handed over with the rows."""

    name: ClassVar[str] = "own-candidates"

    def _candidates(self, batch: Batch, c: int, flt: Filter) -> Candidates:
        half = np.arange(0, self.num_docs, 2)
        rows = np.broadcast_to(half, (batch.scan.shape[0], half.size))
        return Candidates(rows, source=RowTable(half, np.asarray(self.master[half], np.float64)))


def corpus(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return normalize_blocks(rng.standard_normal((n, LAYOUT.dim)).astype(np.float32), LAYOUT)


def brute_force(queries: np.ndarray, rows: np.ndarray, w: np.ndarray, k: int, allowed: Any = None) -> Any:
    s = reference_scores(queries, rows, w, LAYOUT)
    if allowed is not None:
        s = np.where(allowed[None, :], s, -np.inf)
        k = min(k, int(allowed.sum()))
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(s, order, 1)


MASKS = {
    "none": None,
    "selective": np.random.default_rng(1).random(800) < 0.1,
    "broad": np.random.default_rng(2).random(800) < 0.7,
    "empty": np.zeros(800, bool),
    "three rows": np.isin(np.arange(800), [5, 400, 799]),
}


@pytest.mark.parametrize("cls", [ScanOnly, Float16Scan])
@pytest.mark.parametrize("mask", list(MASKS))
def test_a_backend_that_only_scans_is_exact(cls: type[Backend], mask: str) -> None:
    docs, queries = corpus(800, 3), corpus(6, 4)
    w = np.random.default_rng(5).uniform(0, 2, (6, 3))
    w[0] = [0.0, 1.0, 0.0]
    engine = cls(docs, LAYOUT, precision="float16" if cls is Float16Scan else "float32")
    allowed = MASKS[mask]
    for k in (1, 10, 300, 900):
        res = engine.search(queries, w, k, allowed=allowed)
        rows, scores = brute_force(queries, docs, w, k, allowed)
        np.testing.assert_array_equal(res.rows, rows, err_msg=f"{mask} k={k}")
        np.testing.assert_allclose(res.scores, scores, rtol=0, atol=1e-6)
        sub = reference_scores(queries, docs, np.eye(3)[1], LAYOUT)  # block b's cosines
        np.testing.assert_allclose(res.subspace_scores[..., 1], np.take_along_axis(sub, rows, 1), atol=1e-6)


def test_near_ties_in_a_float16_scan_are_completed_by_rescans() -> None:
    rng = np.random.default_rng(6)
    base = corpus(4, 7)
    docs = normalize_blocks(
        np.repeat(base, 200, axis=0) + 1e-3 * rng.standard_normal((800, LAYOUT.dim)), LAYOUT
    )
    docs = docs.astype(np.float32)
    queries = normalize_blocks(base + 1e-3, LAYOUT).astype(np.float32)
    w = np.ones(3)
    engine = Float16Scan(docs, LAYOUT, precision="float16")
    res = engine.search(queries, w, 10)
    np.testing.assert_array_equal(res.rows, brute_force(queries, docs, w, 10)[0])
    assert engine.rescans > 0


def test_the_loop_widens_the_scan_by_four_and_completes_with_every_row() -> None:
    docs = np.tile(corpus(1, 8), (50, 1))  # every row ties: no bound can settle the cut
    engine = ScanOnly(docs, LAYOUT)
    ScanOnly.scans.clear()
    res = engine.search(corpus(1, 9), np.ones(3), 5)
    np.testing.assert_array_equal(res.rows, [[0, 1, 2, 3, 4]])  # ties go to the lower row
    assert ScanOnly.scans == [13]  # k + 8 candidates; then 4 x 13 >= 50 rows: all of them, no scan
    assert engine.rescans == 1


def test_a_candidate_generator_is_reranked_exactly_from_its_own_vectors() -> None:
    docs, queries = corpus(400, 10), corpus(3, 11)
    w = np.array([1.0, 0.3, 0.6])
    res = OwnCandidates(docs, LAYOUT).search(queries, w, 7)
    half = np.zeros(400, bool)
    half[::2] = True
    rows, scores = brute_force(queries, docs, w, 7, half)  # the exact top k of its candidates
    np.testing.assert_array_equal(res.rows, rows)
    np.testing.assert_allclose(res.scores, scores, atol=1e-6)


def test_the_bound_of_a_scan() -> None:
    rows = np.array([[3, 1, 2], [4, -1, -1]])
    scores = np.array([[0.9, 0.5, 0.4], [0.8, -np.inf, -np.inf]], np.float32)
    np.testing.assert_array_equal(scan_bound(np, rows, scores, 3), [np.float32(0.4), -np.inf])
    np.testing.assert_array_equal(scan_bound(np, rows, scores, 4), [-np.inf, -np.inf])  # fewer came back
    r, s = stack_rows([np.array([7, 8]), np.array([9])], [np.array([0.1, 0.2]), np.array([0.3])], width=3)
    np.testing.assert_array_equal(r, [[8, 7, -1], [9, -1, -1]])  # sorted by score, padded
    assert s[0, 2] == -np.inf


def random_block(n: int, vocab: int, seed: int) -> SparseLexical:
    """A sparse block of random nonnegative term weights (what BM25 stores), ~8 terms a row."""
    docs = sp.random(n, vocab, density=8 / vocab, format="csr", dtype=np.float32, random_state=seed)
    idf = np.ones(vocab, np.float32)
    return SparseLexical(docs, tuple(f"t{i}" for i in range(vocab)), idf)


@pytest.mark.parametrize("cls", [ScanOnly, Float16Scan])
@pytest.mark.parametrize("mask", list(MASKS))
def test_a_backend_that_only_scans_adds_a_sparse_block_exactly(cls: type[Backend], mask: str) -> None:
    """The loop's bound holds with the sparse term in the scan (float16 dense products too)."""
    docs, queries = corpus(800, 3), corpus(6, 4)
    block = random_block(800, 50, 5)
    q_sparse = sp.random(6, 50, density=0.1, format="csr", random_state=6)
    w = np.random.default_rng(7).uniform(0, 2, (6, 3))
    w[0] = 0.0  # all on the sparse block
    ws = np.array([1.0, 0.0, 0.5, 2.0, 1.0, 0.3])
    engine = cls(
        docs, LAYOUT, precision="float16" if cls is Float16Scan else "float32", sparse_blocks={"s": block}
    )
    allowed = MASKS[mask]
    total = reference_scores(queries, docs, w, LAYOUT) + ws[:, None] * block.scores(q_sparse)
    if allowed is not None:
        total = np.where(allowed[None, :], total, -np.inf)
    for k in (1, 10, 800):
        res = engine.search(queries, w, k, allowed=allowed, sparse={"s": SparseQuery(q_sparse, ws)})
        kk = k if allowed is None else min(k, int(allowed.sum()))
        rows = np.argsort(-total, axis=1, kind="stable")[:, :kk]
        np.testing.assert_array_equal(res.rows, rows, err_msg=f"{mask} k={k}")
        np.testing.assert_allclose(res.scores, np.take_along_axis(total, rows, 1), rtol=0, atol=1e-6)
