"""The search fast path in front of FastAPI: overrides, unexpected errors, limits, `in_experiment`.

Bodies sent as ``application/json`` may take the fast path; the same body as
``application/x-esp+json`` (FastAPI parses it as JSON, the fast path leaves it alone) takes the
declared route. ``fastpath.run_search`` is counted to know which path answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from fastapi import Request
from fastapi.testclient import TestClient

from service import fastpath
from service.app import ESPApp, create_app
from service.config import Settings
from service.routes import deps
from subspace.bundle import write_bundle
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
ROUTE_ONLY = "application/x-esp+json"
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


def _ready(c: TestClient) -> None:
    for _ in range(600):
        if c.get("/readyz").status_code == 200:
            return
    pytest.fail("not ready")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("outer")
    emb = normalize_blocks(
        np.random.default_rng(0).standard_normal((40, LAYOUT.dim)).astype(np.float32), LAYOUT
    )
    bundle = write_bundle(root / "b", LAYOUT, emb, [f"d{i}" for i in range(40)])
    registry = root / "registry.yaml"
    registry.write_text(yaml.safe_dump(REGISTRY))
    return bundle, registry


@pytest.fixture(scope="module")
def app(files: tuple[Path, Path]) -> ESPApp:
    bundle, registry = files
    return create_app(Settings(bundle=bundle, registry=registry, backend="numpy", threads=1, max_k=20))


@pytest.fixture(scope="module")
def client(app: ESPApp) -> Iterator[TestClient]:
    with TestClient(app) as c:
        _ready(c)
        yield c


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "queries": [{"vector": np.random.default_rng(3).standard_normal(LAYOUT.dim).tolist()}],
        "k": 3,
        **extra,
    }


def _post(client: TestClient, body: Any, content_type: str = "application/json") -> Any:
    return client.post("/v1/search", content=json.dumps(body), headers={"content-type": content_type})


def _metric(client: TestClient, prefix: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_in_experiment_says_whether_the_unit_is_inside_the_traffic(
    client: TestClient, taken: list[int]
) -> None:
    seen = set()
    for i in range(40):
        unit = f"user-{i}"
        assignment = client.get("/v1/experiments/exp/assignment", params={"unit_id": unit}).json()
        fast = _post(client, _body(experiment="exp", unit_id=unit))
        route = _post(client, _body(experiment="exp", unit_id=unit), ROUTE_ONLY)
        assert fast.status_code == route.status_code == 200
        assert fast.json() == route.json()
        body = fast.json()
        assert (body["arm"], body["in_experiment"]) == (assignment["arm"], assignment["included"])
        seen.add((body["arm"], body["in_experiment"]))
    assert len(taken) == 40
    # traffic 0.5: excluded units get the default arm; included ones land in both arms
    assert seen == {("control", False), ("control", True), ("treatment", True)}


def test_in_experiment_is_null_without_an_experiment(client: TestClient) -> None:
    for extra in ({}, {"operating_point": "ent"}, {"weights": [1.0, 0.5]}):
        assert _post(client, _body(**extra)).json()["in_experiment"] is None
        assert _post(client, _body(**extra), ROUTE_ONLY).json()["in_experiment"] is None


def test_the_schema_documents_in_experiment(client: TestClient) -> None:
    props = client.get("/openapi.json").json()["components"]["schemas"]["SearchResponse"]["properties"]
    assert "in_experiment" in props
    assert "traffic" in props["in_experiment"]["description"]


def test_dependency_overrides_send_searches_to_the_declared_route(
    app: ESPApp, client: TestClient, taken: list[int]
) -> None:
    """An override of the search dependency is honoured: the fast path steps aside while any is set."""

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
    assert taken == []
    assert _post(client, _body()).status_code == 200  # overrides gone: the fast path again
    assert taken == [1]


def test_an_unexpected_error_answers_500_counts_it_and_reaches_the_server(
    app: ESPApp, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError("engine on fire")

    monkeypatch.setattr(fastpath, "run_search", broken)
    series = 'esp_requests_total{route="/v1/search",status="500"}'
    before = _metric(client, series)
    with pytest.raises(RuntimeError, match="engine on fire"):  # re-raised for the server to log
        _post(client, _body())
    quiet = TestClient(app, raise_server_exceptions=False)  # no lifespan: the module's client owns it
    r = _post(quiet, _body())
    assert r.status_code == 500
    assert r.json() == {"type": "internal_error", "message": "internal error (logged)", "field": None}
    assert _metric(client, series) == before + 2


def test_fast_path_counts_status_and_duration_once(client: TestClient, taken: list[int]) -> None:
    ok = 'esp_requests_total{route="/v1/search",status="200"}'
    bad = 'esp_requests_total{route="/v1/search",status="422"}'
    duration = 'esp_request_duration_seconds_count{route="/v1/search"}'
    before = [_metric(client, s) for s in (ok, bad, duration)]
    assert _post(client, _body()).status_code == 200
    assert _post(client, _body(k=50)).status_code == 422  # valid body, refused by run_search (max_k)
    assert _post(client, _body(k="3")).status_code == 422  # invalid body: the declared route answers
    assert taken == [1, 1]
    assert [_metric(client, s) for s in (ok, bad, duration)] == [before[0] + 1, before[1] + 2, before[2] + 3]


def test_oversized_and_chunked_bodies_are_left_to_the_body_limit(
    files: tuple[Path, Path], taken: list[int]
) -> None:
    bundle, _ = files
    raw = json.dumps(_body(queries=_body()["queries"] * 8)).encode()
    assert len(raw) > 1024
    settings = Settings(bundle=bundle, backend="numpy", threads=1, max_body_bytes=1024)
    with TestClient(create_app(settings)) as c:
        _ready(c)
        r = c.post("/v1/search", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 413
        chunked = c.post(
            "/v1/search", content=iter([raw[:10], raw[10:]]), headers={"content-type": "application/json"}
        )
        assert chunked.status_code == 413
    assert taken == []


def test_with_tracing_on_there_is_no_fast_path(files: tuple[Path, Path]) -> None:
    bundle, _ = files
    assert create_app(Settings(bundle=bundle, otel=True)).search_fast_path is None
    assert create_app(Settings(bundle=bundle)).search_fast_path is not None
