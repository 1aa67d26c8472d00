"""``POST /v1/cluster`` on the live tiny-bundle server: shape, every keyword once, errors as search."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bench.live_server import LiveServer
from esp_retrieval.service.config import Settings

NAMES = "['semantic', 'entity', 'intent']"
KEYWORDS = [
    "cheap rice cooker",
    "Cheap Rice  Cooker",
    "rice cooker reviews",
    "weather paris",
    "facebook login",
]


@pytest.fixture(scope="module")
def http(served: LiveServer):
    with httpx.Client(base_url=served.url, timeout=60) as client:
        yield client


def test_cluster_returns_every_distinct_keyword_once_with_a_summary(http: httpx.Client) -> None:
    r = http.post("/v1/cluster", json={"keywords": KEYWORDS, "weights": {"semantic": 0.7, "intent": 0.3}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [k["keyword"] for k in body["keywords"]] == [k for i, k in enumerate(KEYWORDS) if i != 1]
    assert body["duplicates"] == [{"index": 1, "duplicate_of": 0}]
    assert body["weights_used"] == {"semantic": 0.7, "entity": 1.0, "intent": 0.3}
    assert body["method"] == "agglomerative" and body["params"]["threshold"] == 0.4
    sizes = {c["cluster_id"]: c["size"] for c in body["clusters"]}
    assert sum(sizes.values()) + body["noise"] == 4
    for row in body["keywords"]:
        summary = body["clusters"][row["cluster_id"]]
        assert row["cluster_label"] == summary["label"]
        assert row["intent"] in {"informational", "navigational", "transactional"}
        assert sum(summary["intent_mix"].values()) == summary["size"]
    assert body["bundle_version"]


def test_operating_point_and_hdbscan_noise(http: httpx.Client) -> None:
    r = http.post(
        "/v1/cluster",
        json={
            "keywords": KEYWORDS[2:],
            "operating_point": "semantic_heavy",
            "method": "hdbscan",
            "min_cluster_size": 5,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["operating_point"] == "semantic_heavy"
    assert body["noise"] == 3 and body["clusters"] == []
    assert all(k["cluster_id"] == -1 and k["cluster_label"] is None for k in body["keywords"])


BAD: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("unknown subspace", {"weights": {"topic": 1.0}}, "weights.topic", NAMES),
    ("negative weight", {"weights": {"semantic": -1}}, "weights.semantic", "greater than or equal to 0"),
    (
        "two weight sources",
        {"weights": [1, 1, 1], "operating_point": "semantic_heavy"},
        "operating_point",
        "one source of weights",
    ),
    ("unknown operating point", {"operating_point": "nope"}, "operating_point", "semantic_heavy"),
    ("unknown method", {"method": "kmeans"}, "method", "['agglomerative', 'hdbscan']"),
    ("threshold for hdbscan", {"method": "hdbscan", "threshold": 0.3}, "threshold", "not a parameter"),
    ("threshold out of range", {"threshold": 3}, "threshold", "less than or equal to 2"),
    ("min_cluster_size 1", {"method": "hdbscan", "min_cluster_size": 1}, "min_cluster_size", "greater than"),
    ("unknown field", {"treshold": 0.3}, "treshold", "not an accepted field"),
]


@pytest.mark.parametrize(("name", "extra", "field", "needle"), BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_refused_naming_the_field(http, name, extra, field, needle) -> None:
    r = http.post("/v1/cluster", json={"keywords": ["a", "b"], **extra})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["type"] == "validation_error"
    assert body["field"] == field
    assert needle in body["message"]


@pytest.mark.parametrize(
    ("keywords", "field", "needle"),
    [
        ([], "keywords", "at least 1"),
        (["ok", "   "], "keywords[1]", "blank"),
        (["ok", 5], "keywords[1]", "valid string"),
        ([f"kw {i}" for i in range(Settings().max_cluster_keywords + 1)], "keywords", "at most"),
    ],
)
def test_bad_keywords(http: httpx.Client, keywords: list[Any], field: str, needle: str) -> None:
    r = http.post("/v1/cluster", json={"keywords": keywords})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    assert needle in r.json()["message"]
