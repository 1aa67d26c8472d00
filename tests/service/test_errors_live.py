"""Every bad input gets the documented status, type, field and message; the server keeps serving."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bench.live_server import LiveServer

D = 32  # the tiny bundle: semantic 16, entity 8, intent 8
GOOD_VECTOR = [1.0] * D
NAMES = "['semantic', 'entity', 'intent']"


def _q(**extra: Any) -> dict[str, Any]:
    return {"queries": [{"vector": GOOD_VECTOR}], **extra}


BAD: list[tuple[str, Any, int, str | None, str]] = [
    ("unknown subspace", _q(weights={"semantic": 1.0, "sematic": 1.0}), 422, "weights.sematic", NAMES),
    (
        "negative weight",
        _q(weights={"semantic": -1.0}),
        422,
        "weights.semantic",
        "greater than or equal to 0",
    ),
    ("huge weight", _q(weights={"entity": 1e7}), 422, "weights.entity", "less than or equal to 1000000"),
    ("boolean weight", _q(weights={"semantic": True}), 422, "weights.semantic", "valid number"),
    ("string weight", _q(weights={"semantic": "1"}), 422, "weights.semantic", "valid number"),
    ("boolean in weight list", _q(weights=[1.0, False, 1.0]), 422, "weights[1]", "valid number"),
    ("all-zero weights", _q(weights=[0, 0, 0]), 422, "weights", "all zero"),
    (
        "all-zero weights by name",
        _q(weights={"semantic": 0, "entity": 0, "intent": 0}),
        422,
        "weights",
        "all zero",
    ),
    ("weight list too short", _q(weights=[1.0, 1.0]), 422, "weights", "exactly 3 values"),
    ("weights not a container", _q(weights=2.0), 422, "weights", "object {subspace: weight}"),
    ("wrong vector length", {"queries": [{"vector": [1.0] * 31}]}, 422, "queries[0].vector", "D=32"),
    (
        "wrong block length",
        {"queries": [{"vector": {"entity": [1.0] * 9}}]},
        422,
        "queries[0].vector.entity",
        "dim 8",
    ),
    (
        "unknown block name",
        {"queries": [{"vector": {"topic": [1.0] * 8}}]},
        422,
        "queries[0].vector.topic",
        NAMES,
    ),
    ("zero vector", {"queries": [{"vector": [0.0] * D}]}, 422, "queries[0].vector", "all zero"),
    ("boolean component", {"queries": [{"vector": [True] * D}]}, 422, "queries[0].vector[0]", "valid number"),
    ("k zero", _q(k=0), 422, "k", "greater than or equal to 1"),
    ("k too large", _q(k=51), 422, "k", "between 1 and 50"),
    ("k as string", _q(k="5"), 422, "k", "valid integer"),
    ("k as float", _q(k=5.0), 422, "k", "valid integer"),
    ("k boolean", _q(k=True), 422, "k", "valid integer"),
    ("no queries", {"queries": []}, 422, "queries", "at least 1"),
    ("too many queries", {"queries": [{"vector": GOOD_VECTOR}] * 9}, 422, "queries", "at most 8"),
    ("queries missing", {"k": 3}, 422, "queries", "required"),
    (
        "text and vector",
        {"queries": [{"text": "a", "vector": GOOD_VECTOR}]},
        422,
        "queries[0]",
        "exactly one",
    ),
    ("neither text nor vector", {"queries": [{}]}, 422, "queries[0]", "exactly one"),
    ("empty text", {"queries": [{"text": ""}]}, 422, "queries[0].text", "at least 1"),
    ("blank text", {"queries": [{"text": "   "}]}, 422, "queries[0]", "non-space"),
    ("unknown field", _q(wieghts={"semantic": 1}), 422, "wieghts", "not an accepted field"),
    (
        "two weight sources",
        _q(weights=[1, 1, 1], operating_point="semantic_heavy"),
        422,
        "operating_point",
        "one source of weights",
    ),
    ("unknown operating point", _q(operating_point="nope"), 422, "operating_point", "semantic_heavy"),
    ("experiment without unit", _q(experiment="ent"), 422, "unit_id", "needs a unit_id"),
    ("unknown experiment", _q(experiment="nope", unit_id="u1"), 422, "experiment", "ent"),
]


@pytest.fixture(scope="module")
def http(served: LiveServer):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        yield c


def _good(http: httpx.Client) -> None:
    r = http.post("/v1/search", json={"queries": [{"vector": GOOD_VECTOR}], "k": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["results"][0]["hits"]) == 2


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_with_field_and_message(
    http: httpx.Client, case: tuple[str, Any, int, str | None, str]
) -> None:
    _, body, status, field, needle = case
    r = http.post("/v1/search", json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"type", "message", "field"}
    assert err["type"] == "validation_error"
    assert err["field"] == field
    assert needle in err["message"]
    _good(http)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(http: httpx.Client, literal: str) -> None:
    vec = ", ".join(["1.0"] * (D - 1))
    for body, field in (
        (f'{{"queries": [{{"vector": [{literal}, {vec}]}}]}}', "queries[0].vector[0]"),
        (
            f'{{"queries": [{{"vector": [{vec}, 1.0]}}], "weights": {{"entity": {literal}}}}}',
            "weights.entity",
        ),
    ):
        r = http.post("/v1/search", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field
        assert "finite" in r.json()["message"]
    _good(http)


def test_malformed_json_is_a_422_without_field(http: httpx.Client) -> None:
    r = http.post("/v1/search", content=b'{"queries": [', headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["type"] == "validation_error"
    assert "not valid JSON" in r.json()["message"]
    _good(http)


def test_oversized_body_by_content_length_is_413(http: httpx.Client) -> None:
    body = json.dumps({"queries": [{"text": "x" * 70_000}]})
    r = http.post("/v1/search", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json() == {
        "type": "payload_too_large",
        "message": "request body is larger than the limit of 65536 bytes",
        "field": None,
    }
    _good(http)


def test_oversized_streamed_body_without_length_is_413(http: httpx.Client) -> None:
    def chunks():
        yield b'{"queries": [{"text": "'
        for _ in range(20):
            yield b"y" * 4096
        yield b'"}]}'

    r = http.post("/v1/search", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413
    assert r.json()["type"] == "payload_too_large"
    _good(http)


def test_unknown_route_and_method_use_the_error_body(http: httpx.Client) -> None:
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["type"] == "not_found"
    r = http.get("/v1/search")
    assert r.status_code == 405
    assert r.json()["type"] == "method_not_allowed"
    _good(http)
