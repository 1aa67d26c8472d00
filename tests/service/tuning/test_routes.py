"""The registry read endpoints, mounted on a small app with the service's error shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from esp_retrieval.service.errors import error_response
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.routes.tuning import router
from esp_retrieval.service.tuning import RegistryWatcher
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
DOC = {
    "default_operating_point": "balanced",
    "operating_points": {
        "balanced": {"weights": {"semantic": 1.0, "entity": 1.0, "intent": 1.0}, "description": "equal"},
        "entity_heavy": {"weights": {"semantic": 0.2, "entity": 0.8, "intent": 0.0}},
    },
    "experiments": {"ent": {
        "salt": "secret-salt-v1", "description": "entity weight", "traffic": 0.5, "default_arm": "control",
        "arms": [
            {"name": "control", "share": 0.5, "operating_point": "balanced"},
            {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy"},
        ],
    }},
}
BUNDLE_POINTS = {"semantic_first": {"weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0},
                                    "description": "best NDCG", "metrics": {"ndcg@10": 0.74}}}


def _app(watcher: RegistryWatcher | None) -> FastAPI:
    app = FastAPI()

    @app.exception_handler(FieldError)  # every domain error, with the status of its class
    async def _handle(_: Request, exc: FieldError) -> JSONResponse:
        return error_response(exc)

    app.include_router(router)
    app.state.registry = watcher  # as create_app does: None until the lifespan starts one
    return app


@pytest.fixture
def watcher(tmp_path: Path) -> RegistryWatcher:
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(DOC))
    w = RegistryWatcher(path, Metrics())
    w.set_layout(LAYOUT, BUNDLE_POINTS)
    return w


@pytest.fixture
def client(watcher: RegistryWatcher) -> TestClient:
    return TestClient(_app(watcher))


def test_operating_points_lists_registry_and_bundle_points(client: TestClient) -> None:
    r = client.get("/v1/operating-points")
    assert r.status_code == 200
    body = r.json()
    assert body["default_operating_point"] == "balanced"
    points = {p["name"]: p for p in body["operating_points"]}
    assert set(points) == {"balanced", "entity_heavy", "semantic_first"}
    assert points["entity_heavy"]["weights"] == {"semantic": 0.2, "entity": 0.8, "intent": 0.0}
    assert points["semantic_first"] == {
        "name": "semantic_first", "weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0},
        "description": "best NDCG", "metrics": {"ndcg@10": 0.74}, "source": "bundle",
    }
    assert points["balanced"]["source"] == "registry"


def test_experiments_lists_arms_without_the_salt(client: TestClient) -> None:
    r = client.get("/v1/experiments")
    assert r.status_code == 200
    assert "secret-salt-v1" not in r.text
    (exp,) = r.json()["experiments"]
    assert exp["name"] == "ent"
    assert exp["traffic"] == 0.5
    assert exp["default_arm"] == "control"
    assert exp["enabled"] is True
    assert len(exp["salt_fingerprint"]) == 12
    assert exp["arms"] == [
        {"name": "control", "share": 0.5, "operating_point": "balanced"},
        {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy"},
    ]


def test_assignment_matches_the_registry_and_is_stable(client: TestClient, watcher: RegistryWatcher) -> None:
    seen = set()
    for i in range(60):
        r = client.get("/v1/experiments/ent/assignment", params={"unit_id": f"user-{i}"})
        assert r.status_code == 200
        body = r.json()
        expected = watcher.current.assignment("ent", f"user-{i}")
        assert body["arm"] == expected.arm.name
        assert body["included"] == expected.included
        assert body["operating_point"] == expected.arm.operating_point
        assert body["weights"] == watcher.current.operating_points[expected.arm.operating_point].weights
        assert body["unit_id"] == f"user-{i}"
        resolved = watcher.current.resolve(LAYOUT, experiment="ent", unit_id=f"user-{i}")
        assert (resolved.arm, resolved.weights_used) == (body["arm"], body["weights"])
        seen.add((body["arm"], body["included"]))
    # traffic 0.5: some units are excluded (served control), included ones land in both arms
    assert seen == {("control", False), ("control", True), ("treatment", True)}
    again = client.get("/v1/experiments/ent/assignment", params={"unit_id": "user-7"}).json()
    assert again == client.get("/v1/experiments/ent/assignment", params={"unit_id": "user-7"}).json()


def test_unknown_experiment_is_404_and_missing_unit_id_is_422(client: TestClient) -> None:
    r = client.get("/v1/experiments/nope/assignment", params={"unit_id": "u"})
    assert r.status_code == 404
    assert r.json() == {"type": "not_found", "message": "unknown experiment 'nope'; defined: ['ent']",
                        "field": "name"}
    assert client.get("/v1/experiments/ent/assignment").status_code == 422
    assert client.get("/v1/experiments/ent/assignment", params={"unit_id": ""}).status_code == 422


def test_routes_follow_a_reload(client: TestClient, watcher: RegistryWatcher) -> None:
    assert watcher.path is not None
    doc = dict(DOC, experiments={})
    watcher.path.write_text(yaml.safe_dump(doc))
    assert watcher.check_now()
    assert client.get("/v1/experiments").json() == {"experiments": []}
    assert client.get("/v1/experiments/ent/assignment", params={"unit_id": "u"}).status_code == 404


def test_without_a_registry_the_routes_are_not_ready() -> None:
    client = TestClient(_app(None))
    r = client.get("/v1/operating-points")
    assert r.status_code == 503
    assert r.json()["type"] == "not_ready"
