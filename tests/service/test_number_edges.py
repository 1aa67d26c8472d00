"""Well-formed numbers at the edges of float64 are answered, or refused 422 naming the field,
never 500: an integer of 401 digits in a filter on a float field, weights of 1e-300 in a
clustering request (their square roots underflow float32; the response had NaN in its JSON)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
HUGE = 10**400  # valid JSON, beyond float64
KEYWORDS = ["cheap rice cooker", "rice cooker reviews", "weather paris", "facebook login"]


def _ready(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.05)
        yield client


@pytest.fixture
def vectors_app(tmp_path: Path) -> Iterator[TestClient]:
    emb = normalize_blocks(np.random.default_rng(0).standard_normal((30, LAYOUT.dim)).astype(np.float32), LAYOUT)
    docs = [{"text": f"passage {i}", "score": i / 4} for i in range(30)]
    bundle = write_bundle(tmp_path / "b", LAYOUT, emb, [f"d{i}" for i in range(30)], docs=docs)
    yield from _ready(Settings(bundle=bundle, backend="numpy", threads=1))


@pytest.mark.parametrize(
    ("condition", "field"),
    [({"eq": HUGE}, "filter.eq"), ({"gt": -HUGE}, "filter.gt"), ({"in": [0.5, HUGE]}, "filter.in[1]")],
)
def test_an_integer_beyond_float64_on_a_float_field_is_a_422(
    vectors_app: TestClient, condition: dict, field: str
) -> None:
    body = {"queries": [{"vector": [1.0] * LAYOUT.dim}], "k": 3, "filter": {"field": "score", **condition}}
    r = vectors_app.post("/v1/search", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and "is not a valid float value" in r.json()["message"]
    assert len(r.json()["message"]) < 200  # the 401 digits are not echoed in full
    ok = vectors_app.post("/v1/search", json={**body, "filter": {"field": "score", "gt": 5}})
    assert ok.status_code == 200, ok.text


@pytest.fixture
def encoder_app(tiny_bundle_factory: Callable[[str], Path]) -> Iterator[TestClient]:
    yield from _ready(Settings(bundle=tiny_bundle_factory("bundle"), backend="numpy", threads=1))


def test_tiny_weights_cluster_as_their_multiples_do(encoder_app: TestClient) -> None:
    """The similarity is ``s / sum(weights)``, scale-invariant as search's ranking is: the
    weights 1e-300 times (1, 0, 0) give the clusters of (1, 0, 0), with finite similarities."""
    answers = {}
    for scale in (1.0, 1e-300):
        weights = {"semantic": scale, "entity": 0.0, "intent": 0.0}
        r = encoder_app.post("/v1/cluster", json={"keywords": KEYWORDS, "weights": weights})
        assert r.status_code == 200, r.text
        assert r.json()["weights_used"] == weights
        answers[scale] = r.json()
    for name in ("keywords", "clusters", "noise"):  # the same geometry: the same numbers
        assert answers[1e-300][name] == answers[1.0][name]
    for row in answers[1e-300]["keywords"]:
        assert row["similarity_to_label"] is not None and 0.0 <= row["similarity_to_label"] <= 1.0
