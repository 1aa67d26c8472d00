"""The SDK covers every route of the OpenAPI document, sync and async, against live servers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.client import AsyncESPClient, ESPClient, ESPError
from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings

#: (method, OpenAPI path) -> the SDK method that calls it
SDK_METHODS = {
    ("post", "/v1/search"): "search",
    ("get", "/healthz"): "health",
    ("get", "/readyz"): "ready",
    ("get", "/v1/layout"): "layout",
    ("get", "/metrics"): "metrics",
    ("get", "/v1/operating-points"): "operating_points",
    ("get", "/v1/experiments"): "experiments",
    ("get", "/v1/experiments/{name}/assignment"): "assignment",
    ("post", "/v1/admin/reload"): "reload",
    ("post", "/v1/cluster"): "cluster",
    ("post", "/v1/embeddings"): "embeddings",
    ("get", "/v1/models"): "models",
    ("get", "/v1/models/{model}"): "model",
    ("post", "/v1/documents"): "upsert_documents",
    ("delete", "/v1/documents/{doc_id}"): "delete_document",
}


def test_every_operation_has_a_sync_and_an_async_method() -> None:
    spec = create_app(Settings()).openapi()
    operations = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert operations <= set(SDK_METHODS), operations - set(SDK_METHODS)
    for name in SDK_METHODS.values():
        assert callable(getattr(ESPClient, name)) and asyncio.iscoroutinefunction(getattr(AsyncESPClient, name))


def test_registry_reads_are_typed(vectors_served: LiveServer) -> None:
    with ESPClient(vectors_served.url) as esp:
        points = esp.operating_points()
        assert {"semantic_heavy", "entity_heavy_reg"} <= {p.name for p in points.operating_points}
        (exp,) = esp.experiments().experiments
        assert exp.name == "ent" and [a.name for a in exp.arms] == ["control", "treatment"]
        a = esp.assignment("ent", "user-42")
        assert a.arm in {"control", "treatment"} and a["arm"] == a.arm  # attribute or key
        res = esp.search([np.ones(32)], k=2, experiment="ent", unit_id="user-42")
        assert res.arm == a.arm and res.weights_used == pytest.approx(a.weights)
        assert esp.ready().rollout is not None and esp.ready().bundle_sha256


def test_documents_routes_answer_through_the_sdk(vectors_served: LiveServer) -> None:
    assert vectors_served.token is not None
    with ESPClient(vectors_served.url, admin_token=vectors_served.token) as esp:
        with pytest.raises(ESPError) as err:  # the numpy backend serves a read-only bundle
            esp.upsert_documents([{"id": "new", "vector": np.ones(32)}])
        assert err.value.status == 409
        with pytest.raises(ESPError) as err:
            esp.delete_document("a b?c")  # quoted into one path segment
        assert err.value.status == 409
    with ESPClient(vectors_served.url) as esp, pytest.raises(ESPError) as err:
        esp.delete_document("x")
    assert err.value.status == 401


def test_models_and_openai_shaped_errors_sync_and_async(served: LiveServer) -> None:
    with ESPClient(served.url) as esp:
        (card,) = esp.models().data
        assert esp.model(card.id).id == card.id == esp.ready().bundle_version
        with pytest.raises(ESPError) as err:
            esp.embeddings([[1, 2, 3]])  # type: ignore[list-item]
        assert (err.value.status, err.value.type, err.value.field) == (422, "token_ids_not_supported", "input")

    async def run() -> None:
        async with AsyncESPClient(served.url) as esp:
            assert (await esp.models()).data[0].id == card.id
            with pytest.raises(ESPError) as err:
                await esp.model("text-embedding-3-small")
            assert err.value.status == 404 and err.value.field == "model"

    asyncio.run(run())


def test_embeddings_and_cluster_sync_and_async(served: LiveServer) -> None:
    with ESPClient(served.url) as esp:
        emb = esp.embeddings(["river bank", "savings bank"], subspaces=["entity"], weights={"entity": 2.0})
        assert [d.index for d in emb.data] == [0, 1] and len(emb.data[0].embedding) == 8
        assert np.linalg.norm(emb.data[0].embedding) == pytest.approx(2.0, rel=1e-5)
        one = esp.embeddings("river bank")
        assert len(one.data) == 1 and one.model == esp.layout().bundle_version
        clusters = esp.cluster(["bank loan", "bank loans", "river bank", "weather paris"], threshold=0.4)
        assert clusters.duplicates == [] or clusters.duplicates[0].duplicate_of >= 0
        assert len(clusters.keywords) >= 3

    async def run() -> None:
        async with AsyncESPClient(served.url) as esp:
            emb = await esp.embeddings(["river bank"], encoding_format="float")
            assert len(emb.data[0].embedding) == 32
            clusters = await esp.cluster(["bank loan", "river bank"])
            assert {k.keyword for k in clusters.keywords} == {"bank loan", "river bank"}
            points = await esp.operating_points()
            assert points.operating_points
            assert (await esp.assignment("ent", "user-1")).experiment == "ent"
            assert (await esp.experiments()).experiments[0].name == "ent"

    asyncio.run(run())
