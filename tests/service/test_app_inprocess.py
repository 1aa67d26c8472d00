"""The app in-process (lifespan included): 429 over HTTP, readiness, error-field mapping."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app, dotted_field, validation_error_body
from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from tests.service.conftest import in_process, until

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})


class GatedEngine:
    """The real engine behind a gate, so a test can hold the worker and fill the queue."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.name = engine.name
        self.capabilities = engine.capabilities
        self.gate = threading.Event()

    def search(self, *args: Any) -> Any:
        self.gate.wait(timeout=30)
        return self._engine.search(*args)


def test_full_queue_answers_429_with_retry_after_then_recovers(small_bundle: Path) -> None:
    settings = Settings(  # a latency budget no wait here comes near: only the full queue refuses
        bundle=small_bundle, backend="numpy", threads=1, queue_size=2, max_queries=2, max_wait_ms=0,
        latency_budget_ms=600_000,
    )
    app = create_app(settings)
    body = {"queries": [{"vector": [1.0] * 12}] * 2, "k": 3}

    gated: list[GatedEngine] = []

    def gate(state: Any) -> GatedEngine:
        gated.append(GatedEngine(state.engine))
        return gated[0]

    async def scenario() -> list[httpx.Response]:
        async with in_process(app, engine=gate) as c:
            first = asyncio.create_task(c.post("/v1/search", json=body))
            await until(lambda: bool(app.state.search.batcher._inflight))  # the worker holds it
            second = asyncio.create_task(c.post("/v1/search", json=body))
            await until(lambda: app.state.search.batcher.depth == 2)  # the queue is full
            third = await c.post("/v1/search", json=body)
            gated[0].gate.set()
            return [await first, await second, third, await c.post("/v1/search", json=body)]

    first, second, third, after = asyncio.run(scenario())
    assert third.status_code == 429
    assert third.headers["retry-after"] == "1"
    assert third.json()["type"] == "overloaded"
    assert [first.status_code, second.status_code, after.status_code] == [200, 200, 200]


def test_readyz_is_503_with_the_reason_when_the_bundle_is_bad(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(bundle=tmp_path / "missing", backend="numpy"))) as c:
        deadline = time.monotonic() + 30
        while "refused" not in c.get("/readyz").json()["message"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["type"] == "not_ready"
        assert "manifest.json: missing" in r.json()["message"]
        assert c.get("/healthz").json() == {"status": "ok"}
        assert "esp_ready 0.0" in c.get("/metrics").text


@pytest.mark.parametrize(
    ("loc", "field"),
    [
        (("body", "queries", 0, "vector", "Full", 3), "queries[0].vector[3]"),
        (("body", "weights", "By-Name", "entity"), "weights.entity"),
        (("body", "weights", "In-Order", 1), "weights[1]"),
        (("query", "unit_id"), "unit_id"),
        (("body",), None),
    ],
)
def test_pydantic_locations_become_dotted_fields(loc: tuple[Any, ...], field: str | None) -> None:
    assert dotted_field(loc) == field


def test_several_errors_are_summarised_in_one_body() -> None:
    errors = [
        {"loc": ("body", "k"), "msg": "Input should be a valid integer", "type": "int_type"},
        {"loc": ("body", "queries"), "msg": "Field required", "type": "missing"},
    ]
    body = validation_error_body(errors)
    assert body == {
        "type": "validation_error",
        "message": "k: Input should be a valid integer; also: queries is required",
        "field": "k",
    }


def _bundle(path: Path, dims: dict[str, int], seed: int) -> Path:
    layout = SubspaceLayout.from_dims(dims)
    emb = normalize_blocks(
        np.random.default_rng(seed).standard_normal((30, layout.dim)).astype(np.float32), layout
    )
    return write_bundle(path, layout, emb, [f"d{i}" for i in range(30)])


def test_reload_refuses_a_bundle_the_registry_does_not_fit(tmp_path: Path) -> None:
    first = _bundle(tmp_path / "a", {"semantic": 8, "entity": 4}, seed=0)
    other_layout = _bundle(tmp_path / "b", {"semantic": 8, "topic": 4}, seed=1)
    registry = tmp_path / "registry.json"
    registry.write_text('{"operating_points": {"ent": {"weights": {"semantic": 0.2, "entity": 1.0}}}}')
    settings = Settings(bundle=first, registry=registry, backend="numpy", admin_token="t0ken")
    auth = {"Authorization": "Bearer t0ken"}
    with TestClient(create_app(settings)) as c:
        deadline = time.monotonic() + 30
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        version = c.get("/readyz").json()["bundle_version"]
        r = c.post("/v1/admin/reload", json={"path": str(other_layout)}, headers=auth)
        assert r.status_code == 409
        assert r.json()["type"] == "reload_failed"
        assert "entity" in r.json()["message"]  # the registry names a subspace the new bundle lacks
        assert c.get("/readyz").json()["bundle_version"] == version
        ok = c.post("/v1/search", json={"queries": [{"vector": [1.0] * 12}], "operating_point": "ent"})
        assert ok.status_code == 200
        assert ok.json()["weights_used"] == {"semantic": 0.2, "entity": 1.0}


def test_reload_to_a_new_layout_revalidates_requests_against_it(tmp_path: Path) -> None:
    first = _bundle(tmp_path / "a", {"semantic": 8, "entity": 4}, seed=0)
    second = _bundle(tmp_path / "b", {"semantic": 6, "topic": 2}, seed=1)
    with TestClient(create_app(Settings(bundle=first, backend="numpy", admin_token="t0ken"))) as c:
        deadline = time.monotonic() + 30
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = c.post("/v1/admin/reload", json={"path": str(second)}, headers={"Authorization": "Bearer t0ken"})
        assert r.status_code == 200, r.text
        assert [s["name"] for s in c.get("/v1/layout").json()["subspaces"]] == ["semantic", "topic"]
        bad = c.post("/v1/search", json={"queries": [{"vector": [1.0] * 12}]})
        assert bad.status_code == 422 and "D=8" in bad.json()["message"]
        good = c.post("/v1/search", json={"queries": [{"vector": [1.0] * 8}], "weights": {"topic": 2.0}})
        assert good.status_code == 200
        assert good.json()["weights_used"] == {"semantic": 1.0, "topic": 2.0}
        info = [line for line in c.get("/metrics").text.splitlines() if line.startswith("esp_bundle_info{")]
        assert info == [
            f'esp_bundle_info{{backend="numpy",dtype="float32",version="{r.json()["bundle_version"]}"}} 1.0'
        ]
