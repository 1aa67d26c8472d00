"""The real server serves a bundle's sparse BM25 block: a ``bm25`` weight ranks exactly by
``sum_k w_k cos_k + w_bm25 bm25`` (the float64 brute force, ties to the lower row), a weight of 0
is the dense ranking, and a vector query that weighs the block is a 422 naming the query."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.encoder import QueryEncoder
from esp_retrieval.subspace.bundle import Bundle, read_bundle
from esp_retrieval.subspace.scoring import reference_scores
from tests.live_fixtures import with_bm25

QUERIES = ["who is robert gray", "the history of the roman empire", "what is a balance sheet"]
DENSE = {"semantic": 0.3, "entity": 0.1, "intent": 0.0}
K = 5


@pytest.fixture(scope="module")
def server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory,
           module_server_factory: Callable[..., LiveServer]) -> LiveServer:
    return module_server_factory(with_bm25(tiny_bundle, tmp_path_factory.mktemp("bm25") / "bundle"))


@pytest.fixture(scope="module")
def bundle(server: LiveServer) -> Bundle:
    return read_bundle(server.bundle)


def _search(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/search", json={"k": K, **body}, timeout=120)


def _brute_force(bundle: Bundle, w_bm25: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, scores, bm25 scores) of the exact top K of every query, ties to the lower row."""
    assert bundle.encoder_dir is not None
    q = QueryEncoder.load(bundle.encoder_dir).encode(QUERIES)
    w = np.array([DENSE[n] for n in bundle.layout.names])
    block = bundle.sparse["bm25"]
    bm25 = block.scores(block.encode(QUERIES))
    total = reference_scores(q, np.asarray(bundle.embeddings), w, bundle.layout) + w_bm25 * bm25
    rows = np.argsort(-total, axis=1, kind="stable")[:, :K]
    return rows, np.take_along_axis(total, rows, 1), np.take_along_axis(bm25, rows, 1)


def _rows(bundle: Bundle, answer: dict[str, Any]) -> list[list[int]]:
    row_of = {d: i for i, d in enumerate(bundle.ids)}
    return [[row_of[h["id"]] for h in r["hits"]] for r in answer["results"]]


def test_a_bm25_weight_ranks_by_the_exact_sum_and_zero_is_the_dense_ranking(
    server: LiveServer, bundle: Bundle
) -> None:
    layout = httpx.get(f"{server.url}/v1/layout", timeout=30).json()
    assert [s["name"] for s in layout["sparse"]] == ["bm25"] and layout["default_weights"]["bm25"] == 0.3

    weighted = _search(server, queries=[{"text": t} for t in QUERIES], weights={**DENSE, "bm25": 2.0})
    assert weighted.status_code == 200, weighted.text
    body = weighted.json()
    rows, scores, bm25 = _brute_force(bundle, 2.0)
    assert _rows(bundle, body) == rows.tolist()
    assert body["weights_used"] == {**DENSE, "bm25": 2.0} and body["backend"] == "numpy"
    for i, result in enumerate(body["results"]):
        np.testing.assert_allclose([h["score"] for h in result["hits"]], scores[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose([h["subspace_scores"]["bm25"] for h in result["hits"]], bm25[i],
                                   rtol=1e-5, atol=1e-7)
        assert list(result["hits"][0]["subspace_scores"]) == [*bundle.layout.names, "bm25"]

    zero = _search(server, queries=[{"text": t} for t in QUERIES], weights={**DENSE, "bm25": 0.0})
    assert zero.status_code == 200, zero.text
    dense_rows, dense_scores, _ = _brute_force(bundle, 0.0)
    assert dense_rows.tolist() != rows.tolist()  # the weight is what moves the ranking
    assert _rows(bundle, zero.json()) == dense_rows.tolist()
    for i, result in enumerate(zero.json()["results"]):
        np.testing.assert_allclose([h["score"] for h in result["hits"]], dense_scores[i], rtol=1e-5, atol=1e-6)
        assert list(result["hits"][0]["subspace_scores"]) == list(bundle.layout.names)


def test_a_vector_query_that_weighs_bm25_is_a_422_naming_it(server: LiveServer, bundle: Bundle) -> None:
    vector = {"semantic": [1.0] * bundle.layout["semantic"].dim}
    res = _search(server, queries=[{"text": "robert gray"}, {"vector": vector}], weights={"bm25": 1.0})
    assert res.status_code == 422, res.text
    assert res.json()["field"] == "queries[1].vector" and "bm25" in res.json()["message"]
    unknown = _search(server, queries=[{"text": "robert gray"}], weights={"bm26": 1.0})
    assert unknown.status_code == 422 and unknown.json()["field"] == "weights.bm26"
    assert "'bm25'" in unknown.json()["message"]
