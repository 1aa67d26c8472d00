"""The registry inside the real app: a file change reaches /v1/search without a restart.

Runs ``create_app`` in-process (lifespan included, so the watcher polls for real) on a small
bundle without an encoder; queries are vectors. The live-server tests cover the same routes
over HTTP with the tiny trained bundle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4, "intent": 4})


def _registry(entity: float, salt: str = "s1") -> dict:
    return {
        "operating_points": {
            "control_point": {"weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0}},
            "entity_point": {"weights": {"semantic": 0.1, "entity": entity, "intent": 0.0}},
        },
        "experiments": {"ent": {"salt": salt, "arms": [
            {"name": "control", "share": 0.5, "operating_point": "control_point"},
            {"name": "treatment", "share": 0.5, "operating_point": "entity_point"},
        ]}},
    }


@pytest.fixture
def app_files(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(7)
    emb = rng.standard_normal((40, LAYOUT.dim)).astype(np.float32)
    for obj in LAYOUT:
        emb[:, obj.offset:obj.end] /= np.linalg.norm(emb[:, obj.offset:obj.end], axis=1, keepdims=True)
    bundle = tmp_path / "bundle"
    write_bundle(bundle, LAYOUT, emb, [f"d{i}" for i in range(40)], sections={"operating_points": {
        "from_bundle": {"weights": {"semantic": 1.0, "entity": 1.0, "intent": 1.0}, "metrics": {"ndcg@10": 0.5}},
    }})
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps(_registry(entity=1.0)))
    return bundle, registry


def _wait(client: TestClient, predicate: Callable[[dict], bool], what: str) -> dict:
    for _ in range(200):  # a deadline (10 s), not a timing assertion; the watcher polls every 0.05 s
        body = client.get("/v1/operating-points").json()
        if predicate(body):
            return body
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_registry_change_reaches_search_without_restart(app_files: tuple[Path, Path]) -> None:
    bundle, registry = app_files
    settings = Settings(bundle=bundle, registry=registry, registry_poll_seconds=0.05, backend="numpy",
                        batching=False)
    app = create_app(settings)
    query = {"queries": [{"vector": [1.0] * LAYOUT.dim}], "k": 3}

    def entity_weight(body: dict) -> float | None:
        points = {p["name"]: p for p in body.get("operating_points", [])}
        return points["entity_point"]["weights"]["entity"] if "entity_point" in points else None

    with TestClient(app) as client:
        _wait(client, lambda b: entity_weight(b) == 1.0, "the initial registry")
        r = client.post("/v1/search", json={**query, "operating_point": "entity_point"})
        assert r.status_code == 200, r.text
        assert r.json()["weights_used"]["entity"] == 1.0
        # bundle points are served beside the file's
        r = client.post("/v1/search", json={**query, "operating_point": "from_bundle"})
        assert r.json()["weights_used"] == {"semantic": 1.0, "entity": 1.0, "intent": 1.0}

        registry.write_text(json.dumps(_registry(entity=2.5)))
        _wait(client, lambda b: entity_weight(b) == 2.5, "the edited registry")
        r = client.post("/v1/search", json={**query, "operating_point": "entity_point"})
        assert r.json()["weights_used"]["entity"] == 2.5

        # an invalid edit is refused: searches keep the last good weights, the failure is counted
        registry.write_text(json.dumps(_registry(entity=-1.0)))
        for _ in range(200):
            metrics = client.get("/metrics").text
            if 'esp_registry_reloads_total{result="failure"} 1.0' in metrics:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the invalid registry was never counted")
        r = client.post("/v1/search", json={**query, "operating_point": "entity_point"})
        assert r.json()["weights_used"]["entity"] == 2.5

        # an experiment search answers with the arm the assignment endpoint gives
        for unit in ("u1", "u2", "u3", "u4"):
            r = client.post("/v1/search", json={**query, "experiment": "ent", "unit_id": unit})
            a = client.get("/v1/experiments/ent/assignment", params={"unit_id": unit}).json()
            assert (r.json()["arm"], r.json()["operating_point"]) == (a["arm"], a["operating_point"])
            assert r.json()["weights_used"] == a["weights"]
        r = client.post("/v1/search", json={**query, "experiment": "ent", "unit_id": "u1",
                                            "weights": {"entity": 1.0}})
        assert r.status_code == 422
        assert "one source of weights" in r.json()["message"]
