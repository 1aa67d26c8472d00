"""Cost per request is bounded and bad bodies are named (in process, lifespan included).

queries x k and the response size are capped (422 naming the limit), clustering by words and by
a deadline (503 + Retry-After); an unparsable body (invalid UTF-8, a 5,000-digit number) is a 400
naming ``body``; a body without a JSON Content-Type says so; admin routes check the token before
the body; an encoder-less bundle does not replace one with an encoder; log lines stay lines.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
TOKEN = "limits-token"


def _wait_ready(client: TestClient) -> None:
    for _ in range(600):
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(client.get("/readyz").text)


@pytest.fixture
def vector_bundle(tmp_path: Path) -> Path:
    x = np.random.default_rng(0).standard_normal((300, LAYOUT.dim)).astype(np.float32)
    docs = [{"text": "long passage " * 200, "title": f"t{i}"} for i in range(300)]
    return write_bundle(tmp_path / "b", LAYOUT, normalize_blocks(x, LAYOUT), [f"d{i}" for i in range(300)], docs=docs)


def _client(bundle: Path, **settings: object) -> Iterator[TestClient]:
    opts: dict[str, object] = {"bundle": bundle, "backend": "numpy", "threads": 1, "admin_token": TOKEN}
    with TestClient(create_app(Settings(**{**opts, **settings}))) as client:  # type: ignore[arg-type]
        _wait_ready(client)
        yield client


@pytest.fixture
def client(vector_bundle: Path) -> Iterator[TestClient]:
    yield from _client(vector_bundle, max_hits=100, max_cluster_tokens=5)


def _query(n: int, k: int) -> dict[str, object]:
    return {"queries": [{"vector": [1.0] * LAYOUT.dim}] * n, "k": k}


def test_queries_times_k_is_capped(client: TestClient) -> None:
    assert client.post("/v1/search", json=_query(10, 10)).status_code == 200  # 100 hits: the cap
    r = client.post("/v1/search", json=_query(11, 10))
    assert r.status_code == 422
    body = r.json()
    assert body["field"] == "k" and "110 hits" in body["message"] and "ESP_MAX_HITS" in body["message"]


def test_the_response_size_is_capped(vector_bundle: Path) -> None:
    for c in _client(vector_bundle, max_response_bytes=65536):
        assert c.post("/v1/search", json=_query(1, 10)).status_code == 200  # ~27 kB of display text
        r = c.post("/v1/search", json=_query(4, 25))  # ~270 kB
        assert r.status_code == 422
        assert r.json()["field"] == "k" and "ESP_MAX_RESPONSE_BYTES" in r.json()["message"]


def _count_submits(monkeypatch: pytest.MonkeyPatch, batcher: Any) -> list[int]:
    """One entry per search the micro-batcher is given (what would reach the engine)."""
    submitted: list[int] = []
    submit = batcher.submit

    async def counted(*args: Any, **kwargs: Any) -> Any:
        submitted.append(1)
        return await submit(*args, **kwargs)

    monkeypatch.setattr(batcher, "submit", counted)
    return submitted


def test_an_answer_too_large_even_at_its_smallest_is_refused_before_the_engine_runs(
    vector_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for c in _client(vector_bundle, max_response_bytes=65536):
        submitted = _count_submits(monkeypatch, c.app.state.search.batcher)  # type: ignore[attr-defined]
        r = c.post("/v1/search", json=_query(4, 25))  # 100 hits of ~2.7 kB of display text each
        assert r.status_code == 422 and r.json()["field"] == "k", r.text
        assert "ESP_MAX_RESPONSE_BYTES" in r.json()["message"]
        assert submitted == []  # refused up front: the engine never ran
        # what might come back smaller is not refused up front: the measure while building decides
        few = c.post("/v1/search", json={**_query(4, 25), "score_threshold": 100.0})
        assert few.status_code == 200 and all(res["hits"] == [] for res in few.json()["results"])
        ids_only = c.post("/v1/search", json={**_query(4, 25), "fields": ["title"]})
        assert ids_only.status_code == 200  # the same hits without their texts fit
        filtered = c.post("/v1/search", json={**_query(4, 25), "filter": {"field": "title", "eq": "t3"}})
        assert filtered.status_code == 200 and len(filtered.json()["results"][0]["hits"]) == 1
        assert len(submitted) == 3


def test_the_estimate_before_the_engine_never_refuses_an_answer_that_fits(tmp_path: Path) -> None:
    # 299 documents of 5,000 characters and one of 5: a mean-based estimate refuses k=1 at 4 kB;
    # the answer (the short one, asked for by its own vector) fits, and is answered
    x = normalize_blocks(np.random.default_rng(5).standard_normal((300, LAYOUT.dim)).astype(np.float32), LAYOUT)
    docs = [{"text": "short" if i == 7 else "x" * 5000} for i in range(300)]
    bundle = write_bundle(tmp_path / "b", LAYOUT, x, [f"d{i}" for i in range(300)], docs=docs)
    for c in _client(bundle, max_response_bytes=4096):
        one = {"queries": [{"vector": x[7].tolist()}], "k": 1}
        r = c.post("/v1/search", json=one)
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["hits"][0]["text"] == "short"
        r = c.post("/v1/search", json={**one, "k": 2})  # the second hit is long: the measure refuses
        assert r.status_code == 422 and r.json()["field"] == "k" and "so far" in r.json()["message"]


def test_unparsable_bodies_are_400_naming_the_body(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    bad_utf8 = client.post("/v1/search", content=b'{"queries": [{"text": "\xff\xfe"}]}', headers=headers)
    assert bad_utf8.status_code == 400
    assert bad_utf8.json()["field"] == "body" and "UTF-8" in bad_utf8.json()["message"]
    digits = b'{"keywords": ["a"], "min_cluster_size": ' + b"7" * 5000 + b"}"
    huge = client.post("/v1/cluster", content=digits, headers=headers)
    assert huge.status_code == 400
    assert huge.json()["field"] == "body" and "4300 digits" in huge.json()["message"]


def test_a_body_without_a_json_content_type_says_so(client: TestClient) -> None:
    body = json.dumps(_query(1, 3)).encode()
    for headers, said in (({}, "no Content-Type"), ({"content-type": "text/plain"}, "'text/plain'")):
        r = client.post("/v1/search", content=body, headers=headers)
        assert r.status_code == 422
        assert r.json()["field"] == "body" and said in r.json()["message"]
        assert "application/json" in r.json()["message"]


@pytest.mark.parametrize("route", ["/v1/admin/reload", "/v1/documents"])
def test_admin_routes_check_the_token_before_parsing_the_body(client: TestClient, route: str) -> None:
    malformed = {"content": b'{"path": ', "headers": {"content-type": "application/json"}}
    assert client.post(route, **malformed).status_code == 401  # type: ignore[arg-type]
    wrong = {"authorization": "Bearer nope", "content-type": "application/json"}
    assert client.post(route, content=b'{"path": ', headers=wrong).status_code == 403
    right = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    assert client.post(route, content=b'{"path": ', headers=right).status_code == 422


def test_a_newline_in_a_reload_path_does_not_forge_log_lines(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    path = "/nowhere\nERROR forged line"
    with caplog.at_level(logging.INFO, logger="esp_retrieval.service.lifecycle"):
        r = client.post("/v1/admin/reload", json={"path": path}, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 409
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "esp_retrieval.service.lifecycle"]
    assert lines and all("\n" not in line for line in lines)
    assert any("\\nERROR forged line" in line for line in lines)


def test_cluster_words_are_capped(client: TestClient) -> None:
    r = client.post("/v1/cluster", json={"keywords": ["one two three", "four five six"]})
    assert r.status_code == 422
    assert r.json()["field"] == "keywords" and "ESP_MAX_CLUSTER_TOKENS" in r.json()["message"]


def test_clustering_past_its_deadline_is_503_with_retry_after(tiny_bundle: Path) -> None:
    for c in _client(tiny_bundle, cluster_timeout_seconds=0.001):
        r = c.post("/v1/cluster", json={"keywords": [f"keyword number {i}" for i in range(600)]})
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1" and "ESP_CLUSTER_TIMEOUT_SECONDS" in r.json()["message"]
        for _ in range(600):  # the abandoned job stops at its next encoder batch and frees its slot
            if c.app.state.cluster_jobs == 0:  # type: ignore[attr-defined]
                break
            time.sleep(0.05)
        assert c.app.state.cluster_jobs == 0  # type: ignore[attr-defined]


def test_an_encoder_less_bundle_is_refused_in_place_of_one_with_an_encoder(
    tiny_bundle: Path, vector_bundle: Path
) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    for c in _client(tiny_bundle):
        served = c.get("/readyz").json()["bundle_version"]
        r = c.post("/v1/admin/reload", json={"path": str(vector_bundle)}, headers=auth)
        assert r.status_code == 409 and "ESP_ALLOW_NO_ENCODER" in r.json()["message"]
        assert c.get("/readyz").json()["bundle_version"] == served
    for c in _client(tiny_bundle, allow_no_encoder=True):
        assert c.post("/v1/admin/reload", json={"path": str(vector_bundle)}, headers=auth).status_code == 200
