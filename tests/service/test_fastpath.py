"""The search fast path answers exactly what the FastAPI route answers, and hands it the rest.

A body sent as ``application/json`` takes the fast path; the same body sent as
``application/x-esp+json`` (which FastAPI parses as JSON, the fast path leaves alone) takes
the declared route. Both must give the same status, headers that matter, and body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.config import Settings
from service.fastjson import loads
from service.fastpath import _parse
from subspace.bundle import write_bundle
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
ROUTE_ONLY = "application/x-esp+json"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    rng = np.random.default_rng(0)
    emb = normalize_blocks(rng.standard_normal((60, LAYOUT.dim)).astype(np.float32), LAYOUT)
    docs = [{"text": f"passage {i}"} for i in range(60)]
    bundle = write_bundle(
        tmp_path_factory.mktemp("fastpath") / "b", LAYOUT, emb, [f"d{i}" for i in range(60)], docs=docs
    )
    settings = Settings(bundle=bundle, backend="numpy", threads=1, max_k=20, max_queries=4)
    with TestClient(create_app(settings)) as c:
        c.get("/readyz")
        for _ in range(600):
            if c.get("/readyz").status_code == 200:
                break
        else:
            pytest.fail("not ready")
        yield c


def _both(client: TestClient, body: Any) -> tuple[Any, Any]:
    raw = json.dumps(body)
    fast = client.post("/v1/search", content=raw, headers={"content-type": "application/json"})
    route = client.post("/v1/search", content=raw, headers={"content-type": ROUTE_ONLY})
    return fast, route


def _vec(seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(LAYOUT.dim).tolist()


@pytest.mark.parametrize(
    "body",
    [
        {"queries": [{"vector": _vec(1)}], "k": 5},
        {"queries": [{"vector": _vec(2)}, {"vector": {"entity": [1, 0, 0, 0]}}], "k": 3, "weights": [1, 0.5]},
        {"queries": [{"vector": _vec(3)}], "weights": {"entity": 2.0}},
    ],
)
def test_valid_searches_answer_the_same_on_both_paths(
    client: TestClient, body: dict[str, Any], taken: list[int]
) -> None:
    fast, route = _both(client, body)
    assert taken == [1]  # the first took the fast path, the second the declared route
    assert fast.status_code == route.status_code == 200
    assert fast.headers["content-type"] == route.headers["content-type"] == "application/json"
    assert fast.json() == route.json()
    assert len(fast.json()["results"]) == len(body["queries"])
    assert fast.json()["results"][0]["hits"][0]["text"].startswith("passage ")


@pytest.mark.parametrize(
    "body",
    [
        {"queries": [{"vector": _vec(1)}], "k": 21},  # the route's own check (k > max_k)
        {"queries": [{"vector": _vec(1)}] * 5},  # too many queries
        {"queries": [{"vector": [0.0] * LAYOUT.dim}]},  # all-zero vector
        {"queries": [{"vector": _vec(1)[:5]}]},  # wrong length
        {"queries": [{"vector": _vec(1)}], "weights": {"nope": 1.0}},  # unknown subspace
        {"queries": [{"vector": _vec(1)}], "weights": [True, 1.0]},  # schema: a bool is no weight
        {"queries": [{"vector": _vec(1)}], "k": "5"},  # schema: strict int
        {"queries": []},
        {"queries": [{"vector": _vec(1)}], "operating_point": "missing"},
    ],
)
def test_errors_answer_the_same_on_both_paths(client: TestClient, body: dict[str, Any]) -> None:
    fast, route = _both(client, body)
    assert fast.status_code == route.status_code == 422
    assert fast.json() == route.json()
    assert fast.json()["type"] == "validation_error"


def test_malformed_and_non_json_bodies_reach_the_route(client: TestClient) -> None:
    bad = client.post("/v1/search", content=b'{"queries": [', headers={"content-type": "application/json"})
    assert bad.status_code == 422
    assert "not valid JSON" in bad.json()["message"]
    text = client.post("/v1/search", content=b"hello", headers={"content-type": "text/plain"})
    assert text.status_code == 422
    empty = client.post("/v1/search", content=b"", headers={"content-type": "application/json"})
    assert empty.status_code == 422
    assert empty.json()["message"] == "a JSON request body is required"
    assert client.get("/v1/search").status_code == 405


def test_fast_path_requests_are_counted_under_the_route_template(client: TestClient) -> None:
    def count() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith('esp_requests_total{route="/v1/search",status="200"}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = count()
    for seed in range(3):
        r = client.post("/v1/search", json={"queries": [{"vector": _vec(seed)}]})
        assert r.status_code == 200
    assert count() == before + 3


def test_parse_refuses_what_the_route_must_judge() -> None:
    assert _parse(b"") is None
    assert _parse(b"[1,") is None
    assert _parse(b'{"queries": [{"vector": [1, 2]}], "k": true}') is None
    ok = _parse(b'{"queries": [{"vector": [1, 2]}], "k": 3}')
    assert ok is not None
    assert ok.k == 3


@pytest.mark.parametrize(
    "raw",
    [b'{"a": 1.5, "b": [1, -0.0, 1e400]}', b'{"a":"\\ud800"}', b'\xef\xbb\xbf{"a": 1}', b'{"a": NaN}'],
)
def test_loads_gives_what_json_loads_gives(raw: bytes) -> None:
    assert repr(loads(raw)) == repr(json.loads(raw))


@pytest.mark.parametrize("raw", [b'{"a": 1}x', b"[1,]", b'{"a": "x\ty"}'])
def test_loads_raises_what_json_loads_raises(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as got:
        loads(raw)
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(raw)
    assert str(got.value) == str(want.value)

