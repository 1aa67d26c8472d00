"""A search request's sparse BM25 block: weights by name -> the engine's ``SparseQuery`` (esp_retrieval.service.sparse_query).

The bundle is the tiny bundle plus a real BM25 block over its passages (``esp_retrieval.training.sparse_lexical``);
the states are what the service loads (:func:`esp_retrieval.service.state.load_state`), the batches go through the
real micro-batcher, and every ranking is checked against the float64 brute force of
``sum_k w_k cos_k + w_bm25 bm25``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from esp_retrieval.service import sparse_query
from esp_retrieval.service.config import Settings
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.schemas import SearchRequest
from esp_retrieval.service.search.batching import MicroBatcher, QueryInput
from esp_retrieval.service.state import ServingState, load_state
from esp_retrieval.service.tuning import Registry, RegistryError
from esp_retrieval.subspace.errors import FieldError
from tests.live_fixtures import with_bm25

QUERIES = ["who is robert gray", "the history of the roman empire", "what is a balance sheet"]


@pytest.fixture(scope="module")
def bundle_dir(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_bm25(tiny_bundle, tmp_path_factory.mktemp("sparse") / "bundle")


@pytest.fixture(scope="module")
def state(bundle_dir: Path) -> ServingState:
    return load_state(bundle_dir, Settings(backend="numpy", threads=1))


def _request(**body: Any) -> SearchRequest:
    body.setdefault("queries", [{"text": q} for q in QUERIES])
    return SearchRequest.model_validate(body)


def _resolve(state: ServingState, body: SearchRequest, registry: Registry | None = None) -> Any:
    registry = registry or Registry.parse(None, state.weight_layout, state.bundle.operating_points)
    return registry.resolve(state.weight_layout, weights=body.weights, operating_point=body.operating_point,
                            experiment=body.experiment, unit_id=body.unit_id)


def test_the_served_state_scores_the_bundles_sparse_block(state: ServingState) -> None:
    assert list(state.sparse) == ["bm25"]
    assert state.weight_layout.names == (*state.layout.names, "bm25")
    assert state.weight_layout.default_weights()[-1] == 0.3


def test_a_weight_for_bm25_is_that_blocks_weight_per_query_row(state: ServingState) -> None:
    body = _request(weights={"semantic": 0.5, "bm25": 0.7})
    resolved = _resolve(state, body)
    dense, sparse = sparse_query.for_request(body, resolved, state)
    defaults = state.layout.default_weights()
    np.testing.assert_array_equal(dense, [0.5, *defaults[1:]])
    assert sparse is not None and sparse.tolist() == [0.7]
    assert resolved.weights_used["bm25"] == 0.7


def test_unknown_weight_names_list_the_sparse_block_too(state: ServingState) -> None:
    with pytest.raises(RegistryError) as err:
        _resolve(state, _request(weights={"bm26": 1.0}))
    assert err.value.field == "weights.bm26"
    assert "'bm25'" in err.value.message and "'semantic'" in err.value.message


def test_operating_points_and_experiment_arms_may_name_bm25(state: ServingState) -> None:
    doc = {
        "version": 1,
        "operating_points": {"lexical": {"weights": {"semantic": 0.2, "entity": 0.0, "intent": 0.0, "bm25": 0.8}},
                             "dense": {"weights": {"semantic": 1.0, "bm25": 0.0}}},
        "experiments": {"lex": {"salt": "s1", "arms": [{"name": "a", "share": 1.0, "operating_point": "lexical"}]}},
    }
    registry = Registry.parse(doc, state.weight_layout, state.bundle.operating_points)
    for body in (_request(operating_point="lexical"), _request(experiment="lex", unit_id="u1")):
        _, sparse = sparse_query.for_request(body, _resolve(state, body, registry), state)
        assert sparse is not None and sparse.tolist() == [0.8]
    bad = {"version": 1, "operating_points": {"x": {"weights": {"semantic": 1.0, "bm26": 1.0}}}}
    with pytest.raises(RegistryError, match="bm25"):
        Registry.parse(bad, state.weight_layout)


def test_a_vector_query_with_a_sparse_weight_is_refused(state: ServingState) -> None:
    vector = {"semantic": [1.0] * state.layout["semantic"].dim}
    body = _request(queries=[{"text": "robert gray"}, {"vector": vector}], weights={"bm25": 0.5})
    with pytest.raises(FieldError) as err:
        sparse_query.for_request(body, _resolve(state, body), state)
    assert err.value.field == "queries[1].vector"
    assert "'bm25'" in err.value.message and "text" in err.value.message
    zero = _request(queries=[{"vector": vector}], weights={"bm25": 0.0})
    _, sparse = sparse_query.for_request(zero, _resolve(state, zero), state)
    assert sparse is not None and sparse.tolist() == [0.0]


def test_a_backend_without_sparse_serves_the_bundle_dense_and_refuses_a_sparse_weight(bundle_dir: Path) -> None:
    faiss = load_state(bundle_dir, Settings(backend="faiss", threads=1))
    try:
        assert faiss.engine.name == "faiss" and faiss.sparse == {}
        body = _request(weights={"bm25": 0.0})
        dense, sparse = sparse_query.for_request(body, _resolve(faiss, body), faiss)
        assert sparse is None and dense.tolist() == faiss.layout.default_weights().tolist()
        for body, field in ((_request(weights={"bm25": 0.4}), "weights.bm25"), (_request(), "weights")):
            with pytest.raises(FieldError) as err:
                sparse_query.for_request(body, _resolve(faiss, body), faiss)
            assert err.value.field == field and "'faiss'" in err.value.message
    finally:
        faiss.retire()


def test_engine_sparse_encodes_the_text_rows_in_place() -> None:
    from esp_retrieval.training.sparse_lexical import build_bm25

    block = build_bm25(["robert gray was a sea captain", "the roman empire", "gray whales of the pacific"])
    texts = [None, "robert gray", None, "roman empire"]
    out = sparse_query.engine_sparse({"bm25": block}, texts, np.array([[0.0], [0.5], [0.0], [1.0]]))
    assert out is not None
    vectors, weight = out["bm25"]
    want = block.encode(["robert gray", "roman empire"])
    assert vectors.shape == (4, len(block.vocab)) and vectors[[0, 2]].nnz == 0
    np.testing.assert_array_equal(vectors[[1, 3]].toarray(), want.toarray())
    assert weight.tolist() == [0.0, 0.5, 0.0, 1.0]
    assert sparse_query.engine_sparse({"bm25": block}, texts, np.zeros((4, 1))) is None  # no weight: dense


def _brute_force(state: ServingState, texts: list[str], dense: np.ndarray, w_bm25: float, k: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores of the float64 top ``k`` of ``sum_k w_k cos_k + w_bm25 bm25`` (ties: lower row)."""
    q = state.encode(texts).astype(np.float64)
    docs = np.asarray(state.bundle.embeddings, dtype=np.float64)
    score = np.zeros((len(texts), docs.shape[0]))
    for w, o in zip(dense, state.layout.objectives, strict=True):
        score += w * (q[:, o.offset : o.end] @ docs[:, o.offset : o.end].T)
    block = state.sparse["bm25"]
    score += w_bm25 * block.scores(block.encode(texts))
    rows = np.stack([np.lexsort((np.arange(s.shape[0]), -s))[:k] for s in score])
    return rows, np.take_along_axis(score, rows, axis=1)


def test_a_batch_adds_the_bm25_term_per_row_and_reports_its_score(state: ServingState) -> None:
    dense = np.array([0.3, 0.1, 0.0])
    k = 5

    async def run() -> list[Any]:
        b = MicroBatcher(Metrics(), max_batch=64, max_wait_ms=50.0, queue_size=64)
        await b.start()
        try:  # one request weighs bm25, one does not; they may share a batch
            return await asyncio.gather(
                b.submit(state, [QueryInput(text=t) for t in QUERIES], dense, k, sparse_weights=np.array([2.0])),
                b.submit(state, [QueryInput(text=t) for t in QUERIES], dense, k, sparse_weights=np.array([0.0])),
            )
        finally:
            await b.stop()

    weighted, zero = asyncio.run(run())
    rows, scores = _brute_force(state, QUERIES, dense, 2.0, k)
    dense_rows, dense_scores = _brute_force(state, QUERIES, dense, 0.0, k)
    assert rows.tolist() != dense_rows.tolist()  # the term moves the ranking
    block = state.sparse["bm25"]
    for i, hits in enumerate(weighted):
        assert hits.rows.tolist() == rows[i].tolist()
        np.testing.assert_allclose(hits.scores, scores[i], rtol=1e-5, atol=1e-6)
        assert hits.columns == (*state.layout.names, "bm25")
        want = block.scores(block.encode([QUERIES[i]]))[0, rows[i]]
        np.testing.assert_allclose(hits.subspace_scores[:, -1], want, rtol=1e-5, atol=1e-7)
    for i, hits in enumerate(zero):
        assert hits.rows.tolist() == dense_rows[i].tolist()
        np.testing.assert_allclose(hits.scores, dense_scores[i], rtol=1e-5, atol=1e-6)
        assert hits.columns == state.layout.names and hits.subspace_scores.shape == (k, len(state.layout))


def test_routes_without_a_sparse_term_take_the_dense_part(state: ServingState) -> None:
    """/v1/cluster and /v1/embeddings resolve the same names, then keep the dense blocks' weights."""
    body = _request(weights={"semantic": 0.5, "bm25": 0.9})
    dense = sparse_query.dense_only(_resolve(state, body), state.layout)
    assert dense.block_weights.tolist() == [0.5, *state.layout.default_weights()[1:].tolist()]
    assert list(dense.weights_used) == list(state.layout.names)
    only_bm25 = _request(weights={"semantic": 0.0, "entity": 0.0, "intent": 0.0, "bm25": 1.0})
    with pytest.raises(FieldError, match="sparse blocks do not apply"):
        sparse_query.dense_only(_resolve(state, only_bm25), state.layout)
