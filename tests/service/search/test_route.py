"""``POST /v1/search`` in-process: bodies, error bodies, metrics, ``in_experiment``, overrides.

The live-server tests (``test_route_live``, ``test_errors_live``) cover the ranking and every
documented validation error; these cover what they do not: how the route answers non-JSON and
empty bodies, what it counts, an unexpected error, and the JSON codec it parses with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.service.schemas import SearchRequest
from esp_retrieval.service.search import codec
from esp_retrieval.service.search import pipeline as deps
from esp_retrieval.service.search import route as search_route
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
REGISTRY = {
    "operating_points": {
        "sem": {"weights": {"semantic": 1.0, "entity": 0.1}},
        "ent": {"weights": {"semantic": 0.1, "entity": 1.0}},
    },
    "experiments": {
        "exp": {
            "salt": "s1",
            "traffic": 0.5,
            "default_arm": "control",
            "arms": [
                {"name": "control", "share": 0.5, "operating_point": "sem"},
                {"name": "treatment", "share": 0.5, "operating_point": "ent"},
            ],
        }
    },
}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    root = tmp_path_factory.mktemp("search")
    emb = normalize_blocks(np.random.default_rng(0).standard_normal((60, LAYOUT.dim)).astype(np.float32), LAYOUT)
    docs = [{"text": f"passage {i}"} for i in range(60)]
    bundle = write_bundle(root / "b", LAYOUT, emb, [f"d{i}" for i in range(60)], docs=docs)
    registry = root / "registry.yaml"
    registry.write_text(yaml.safe_dump(REGISTRY))
    settings = Settings(bundle=bundle, registry=registry, backend="numpy", threads=1, max_k=20, max_queries=4)
    return create_app(settings)


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        for _ in range(600):
            if c.get("/readyz").status_code == 200:
                break
        else:
            pytest.fail("not ready")
        yield c


def _vec(seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(LAYOUT.dim).tolist()


def _body(**extra: Any) -> dict[str, Any]:
    return {"queries": [{"vector": _vec(3)}], "k": 3, **extra}


def _post(client: TestClient, body: Any) -> Any:
    return client.post("/v1/search", content=json.dumps(body), headers={"content-type": "application/json"})


def _metric(client: TestClient, prefix: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    "body",
    [
        {"queries": [{"vector": _vec(1)}], "k": 5},
        {"queries": [{"vector": _vec(2)}, {"vector": {"entity": [1, 0, 0, 0]}}], "k": 3, "weights": [1, 0.5]},
        {"queries": [{"vector": _vec(3)}], "weights": {"entity": 2.0}},
    ],
)
def test_valid_searches_answer_json_with_one_result_per_query(client: TestClient, body: dict[str, Any]) -> None:
    r = _post(client, body)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert len(r.json()["results"]) == len(body["queries"])
    assert len(r.json()["results"][0]["hits"]) == body.get("k", 10)
    assert r.json()["results"][0]["hits"][0]["text"].startswith("passage ")


def test_a_body_that_is_json_under_another_media_type_is_searched(client: TestClient) -> None:
    r = client.post("/v1/search", content=json.dumps(_body()), headers={"content-type": "application/x-esp+json"})
    assert r.status_code == 200
    assert len(r.json()["results"][0]["hits"]) == 3


def test_non_json_and_empty_bodies_are_422(client: TestClient) -> None:
    text = client.post("/v1/search", content=b"hello", headers={"content-type": "text/plain"})
    assert text.status_code == 422
    assert text.json()["type"] == "validation_error"
    empty = client.post("/v1/search", content=b"", headers={"content-type": "application/json"})
    assert empty.status_code == 422
    assert empty.json() == {"type": "validation_error", "message": "a JSON request body is required", "field": None}


def test_requests_are_counted_once_by_status_under_the_route_template(client: TestClient) -> None:
    ok = 'esp_requests_total{route="/v1/search",status="200"}'
    bad = 'esp_requests_total{route="/v1/search",status="422"}'
    duration = 'esp_request_duration_seconds_count{route="/v1/search"}'
    before = [_metric(client, s) for s in (ok, bad, duration)]
    assert _post(client, _body()).status_code == 200
    assert _post(client, _body(k=50)).status_code == 422  # a valid body refused by the route (max_k)
    assert _post(client, _body(k="3")).status_code == 422  # refused by the schema
    assert [_metric(client, s) for s in (ok, bad, duration)] == [before[0] + 1, before[1] + 2, before[2] + 3]


def test_an_unexpected_error_answers_500_counts_it_and_reaches_the_server(
    app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError("engine on fire")

    monkeypatch.setattr(search_route, "run_search", broken)
    series = 'esp_requests_total{route="/v1/search",status="500"}'
    before = _metric(client, series)
    with pytest.raises(RuntimeError, match="engine on fire"):  # re-raised for the server to log
        _post(client, _body())
    quiet = TestClient(app, raise_server_exceptions=False)  # no lifespan: the module's client owns it
    r = _post(quiet, _body())
    assert r.status_code == 500
    assert r.json() == {"type": "internal_error", "message": "internal error (logged)", "field": None}
    assert _metric(client, series) == before + 2


def test_dependency_overrides_are_honoured(app: FastAPI, client: TestClient) -> None:
    async def tight_context(request: Request) -> deps.SearchContext:
        ctx = await deps.search_context(request)
        settings = ctx.settings.model_copy(update={"max_k": 2})
        return deps.SearchContext(ctx.state, settings, ctx.batcher, ctx.metrics, ctx.registry)

    app.dependency_overrides[deps.search_context] = tight_context
    try:
        r = _post(client, _body())
        assert r.status_code == 422
        assert r.json()["message"] == "k must be between 1 and 2, got 3"
    finally:
        app.dependency_overrides.clear()
    assert _post(client, _body()).status_code == 200


def test_in_experiment_says_whether_the_unit_is_inside_the_traffic(client: TestClient) -> None:
    seen = set()
    for i in range(40):
        unit = f"user-{i}"
        assignment = client.get("/v1/experiments/exp/assignment", params={"unit_id": unit}).json()
        r = _post(client, _body(experiment="exp", unit_id=unit))
        assert r.status_code == 200
        body = r.json()
        assert (body["arm"], body["in_experiment"]) == (assignment["arm"], assignment["included"])
        seen.add((body["arm"], body["in_experiment"]))
    # traffic 0.5: excluded units get the default arm; included ones land in both arms
    assert seen == {("control", False), ("control", True), ("treatment", True)}


def test_in_experiment_is_null_without_an_experiment(client: TestClient) -> None:
    for extra in ({}, {"operating_point": "ent"}, {"weights": [1.0, 0.5]}):
        assert _post(client, _body(**extra)).json()["in_experiment"] is None


def test_the_schema_documents_in_experiment(client: TestClient) -> None:
    props = client.get("/openapi.json").json()["components"]["schemas"]["SearchResponse"]["properties"]
    assert "in_experiment" in props
    assert "traffic" in props["in_experiment"]["description"]


@pytest.mark.parametrize(
    "raw",
    [b'{"a": 1.5, "b": [1, -0.0, 1e400]}', b'{"a":"\\ud800"}', b'\xef\xbb\xbf{"a": 1}', b'{"a": NaN}'],
)
def test_the_body_codec_accepts_what_json_loads_accepts(raw: bytes) -> None:
    assert repr(codec._loads(raw)) == repr(json.loads(raw))


@pytest.mark.parametrize("raw", [b'{"a": 1}x', b"[1,]", b'{"a": "x\ty"}'])
def test_the_body_codec_refuses_with_json_loads_messages(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as got:
        codec._loads(raw)
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(raw)
    assert str(got.value) == str(want.value)


def test_a_valid_body_calls_the_endpoint_directly_and_answers_as_fastapi_would(
    app: FastAPI, client: TestClient
) -> None:
    route = next(r for r in app.routes if getattr(r, "path", None) == "/v1/search")
    direct = codec._DirectCall.of(route.dependant)
    assert direct is not None
    assert direct.body_name == "body" and [c for _, c in direct.dependencies] == [deps.search_context]
    body = _body(weights={"semantic": 0.3, "entity": 1.0})
    fast = _post(client, body)

    async def same_context(request: Request) -> deps.SearchContext:
        return await deps.search_context(request)

    app.dependency_overrides[deps.search_context] = same_context  # FastAPI's own handler now
    try:
        solved = _post(client, body)
    finally:
        app.dependency_overrides.clear()
    assert fast.status_code == solved.status_code == 200
    assert fast.content == solved.content
    assert fast.headers["content-type"] == solved.headers["content-type"]


def test_a_route_that_needs_more_than_a_body_and_the_request_is_solved_by_fastapi() -> None:
    probe = FastAPI()

    async def endpoint(body: SearchRequest, q: int = 0) -> None: ...

    probe.router.add_api_route("/p", endpoint, methods=["POST"], route_class_override=codec.PydanticJSONRoute)
    route = probe.routes[-1]
    assert codec._DirectCall.of(route.dependant) is None  # a query parameter

    async def returns_content(body: SearchRequest) -> dict[str, Any]:
        return {}

    probe.router.add_api_route("/d", returns_content, methods=["POST"], route_class_override=codec.PydanticJSONRoute)
    assert codec._DirectCall.of(probe.routes[-1].dependant) is None  # FastAPI serialises its result
