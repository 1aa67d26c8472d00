"""``POST /v1/embeddings`` against the live loopback server: plain httpx and the ``openai`` client.

The vectors are compared with the bundle's encoder run in this process, so the route returns
exactly what the encoder computes (blocks, weights and base64 included).
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.live_server import LiveServer
from subspace.bundle import read_bundle

TEXTS = ["what is a bank", "river bank erosion", "open a savings account"]


@pytest.fixture(scope="module")
def reference(served_bundle: Path) -> np.ndarray:
    from encoder.query_encoder import QueryEncoder

    enc = QueryEncoder.load(served_bundle / "encoder")
    return enc.encode(TEXTS)


def _post(server: LiveServer, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=30)


def test_list_input_matches_the_encoder(served: LiveServer, served_bundle: Path, reference: np.ndarray) -> None:
    r = _post(served, {"input": TEXTS, "model": "anything"})
    assert r.status_code == 200, r.text
    body = r.json()
    version = read_bundle(served_bundle).version
    assert body["object"] == "list" and body["model"] == version
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-6)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(TEXTS)
    assert [b["name"] for b in body["subspaces"]] == ["semantic", "entity", "intent"]
    assert body["weights_used"] is None


def test_string_input_and_base64(served: LiveServer, reference: np.ndarray) -> None:
    r = _post(served, {"input": TEXTS[1], "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    (item,) = r.json()["data"]
    vec = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, reference[1], atol=1e-6)


def test_subspaces_and_weights_are_block_scaled(
    served: LiveServer, served_layout, reference: np.ndarray
) -> None:
    r = _post(served, {"input": TEXTS, "subspaces": ["intent", "semantic"], "weights": {"semantic": 2.0}})
    assert r.status_code == 200, r.text
    body = r.json()
    # layout order, whatever the request order; missing names take the default (1.0 here)
    assert [(b["name"], b["offset"], b["dim"]) for b in body["subspaces"]] == [
        ("semantic", 0, 16), ("intent", 16, 8)
    ]
    w = body["weights_used"]
    got = np.array([d["embedding"] for d in body["data"]])
    sem, intent = served_layout.slice("semantic"), served_layout.slice("intent")
    expected = np.concatenate([reference[:, sem] * w["semantic"], reference[:, intent] * w["intent"]], axis=1)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_weighted_inner_product_is_the_search_score(served: LiveServer, served_bundle: Path) -> None:
    """A weighted query embedding dotted with the bundle's (unweighted) document vectors gives
    the score the search route returns: the result works in any inner-product store."""
    weights = {"semantic": 0.3, "entity": 1.0, "intent": 0.2}
    r = _post(served, {"input": TEXTS[0], "weights": weights})
    q = np.array(r.json()["data"][0]["embedding"], dtype=np.float64)
    s = httpx.post(
        f"{served.url}/v1/search", json={"queries": [{"text": TEXTS[0]}], "weights": weights, "k": 5}, timeout=30
    ).json()
    bundle = read_bundle(served_bundle)
    row = {doc_id: i for i, doc_id in enumerate(bundle.ids)}
    docs = np.asarray(bundle.embeddings, dtype=np.float64)
    hits = s["results"][0]["hits"]
    assert len(hits) == 5
    for hit in hits:
        assert float(q @ docs[row[hit["id"]]]) == pytest.approx(hit["score"], abs=1e-5)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": [1, 2, 3]}, "input"),
        ({"input": ["a"], "subspaces": ["nope"]}, "subspaces[0]"),
        ({"input": ["a"], "dimensions": 7}, "dimensions"),
        ({"input": ["a"], "encoding_format": "int8"}, "encoding_format"),
        ({"input": ["a"], "weights": {"semantic": -1}}, "weights.semantic"),
        ({"input": ["a"], "operating_point": "missing"}, "operating_point"),
        ({"input": ["a"] * 9}, "input"),
    ],
)
def test_bad_requests_name_the_field(served: LiveServer, body: dict, field: str) -> None:
    r = _post(served, body)
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "validation_error"
    assert (r.json()["field"] or "").startswith(field)


def test_the_openai_client(served: LiveServer, served_bundle: Path, reference: np.ndarray) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=30)
    resp = client.embeddings.create(model="esp", input=TEXTS)  # the client asks for base64 by default
    assert resp.model == read_bundle(served_bundle).version
    got = np.array([d.embedding for d in resp.data], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-6)
    one = client.embeddings.create(model="esp", input=TEXTS[2], encoding_format="float", dimensions=32)
    np.testing.assert_allclose(np.array(one.data[0].embedding), reference[2], atol=1e-6)
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model="esp", input=TEXTS, dimensions=3)
