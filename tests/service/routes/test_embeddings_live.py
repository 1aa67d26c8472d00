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
from esp_retrieval.subspace.bundle import read_bundle

TEXTS = ["what is a bank", "river bank erosion", "open a savings account"]


@pytest.fixture(scope="module")
def reference(served_bundle: Path) -> np.ndarray:
    from esp_retrieval.encoder.query_encoder import QueryEncoder

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
        ({"input": ["a"], "subspaces": ["nope"]}, "subspaces[0]"),
        ({"input": ["a"], "dimensions": 7}, "dimensions"),
        ({"input": ["a"], "encoding_format": "int8"}, "encoding_format"),
        ({"input": ["a"], "weights": {"semantic": -1}}, "weights.semantic"),
        ({"input": ["a"], "operating_point": "missing"}, "operating_point"),
        ({"input": ["a"] * 2049}, "input"),
    ],
)
def test_bad_requests_name_the_field_in_openais_error_shape(served: LiveServer, body: dict, field: str) -> None:
    r = _post(served, body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "validation_error"
    assert (error["param"] or "").startswith(field), error


def test_2048_inputs_are_one_request(served: LiveServer) -> None:
    """OpenAI's count, not ESP_MAX_QUERIES (8 on this server): only the token cap bounds it."""
    r = _post(served, {"input": [f"passage {i}" for i in range(2048)]})
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["data"]) == 2048


@pytest.mark.parametrize("ids", [[1, 2, 3], [[101, 2054], [101, 2003, 102]]])
def test_token_ids_get_a_422_that_names_the_langchain_setting(served: LiveServer, ids: list) -> None:
    r = _post(served, {"input": ids, "model": "text-embedding-3-small"})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "token_ids_not_supported" and error["param"] == "input"
    assert "check_embedding_ctx_length=False" in error["message"] and "send the texts as strings" in error["message"]


def test_errors_elsewhere_keep_the_services_shape(served: LiveServer) -> None:
    r = httpx.post(f"{served.url}/v1/search", json={"queries": []}, timeout=30)
    assert r.status_code == 422 and set(r.json()) == {"type", "message", "field"}


def test_models_lists_the_served_encoder(served: LiveServer, served_bundle: Path) -> None:
    version = read_bundle(served_bundle).version
    body = httpx.get(f"{served.url}/v1/models", timeout=30).json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == version and card["object"] == "model" and card["owned_by"] == "esp-retrieval"
    assert card["created"] > 1_600_000_000
    assert httpx.get(f"{served.url}/v1/models/{version}", timeout=30).json() == card
    r = httpx.get(f"{served.url}/v1/models/gpt-4", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert r.json()["error"]["param"] == "model"


def test_the_openai_client(served: LiveServer, served_bundle: Path, reference: np.ndarray) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=30)
    resp = client.embeddings.create(model="esp", input=TEXTS)  # the client asks for base64 by default
    assert resp.model == read_bundle(served_bundle).version
    got = np.array([d.embedding for d in resp.data], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-6)
    one = client.embeddings.create(model="esp", input=TEXTS[2], encoding_format="float", dimensions=32)
    np.testing.assert_allclose(np.array(one.data[0].embedding), reference[2], atol=1e-6)
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.embeddings.create(model="esp", input=TEXTS, dimensions=3)
    assert err.value.code == "validation_error" and "the vectors are 32 wide" in err.value.message
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.embeddings.create(model="esp", input=[[1, 2, 3]])
    assert err.value.code == "token_ids_not_supported" and "check_embedding_ctx_length=False" in err.value.message
    models = client.models.list()
    assert [m.id for m in models.data] == [resp.model]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text-embedding-3-small")


def _embedding_requests(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    prefix = 'esp_requests_total{route="/v1/embeddings",status="200"} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(prefix))


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    from esp_retrieval.training.data.trec import iter_corpus

    return [text for _, text in iter_corpus(limit=3000)]


def test_langchain_at_its_defaults_embeds_3000_documents(
    served_bundle: Path, server_factory, corpus: list[str]
) -> None:
    """LangChain's OpenAIEmbeddings with its default chunk_size (1,000 texts per request) and the
    one setting this service needs (no tiktoken ids), against a server at the default limits."""
    langchain_openai = pytest.importorskip("langchain_openai")
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    assert langchain_openai.OpenAIEmbeddings.model_fields["chunk_size"].default == 1000
    server = server_factory(served_bundle)  # ESP_MAX_BODY_BYTES and the embedding caps at their defaults
    emb = langchain_openai.OpenAIEmbeddings(
        model="esp", base_url=f"{server.url}/v1", api_key="unused", check_embedding_ctx_length=False,
        max_retries=0,
    )
    vectors = np.array(emb.embed_documents(corpus), dtype=np.float32)
    assert vectors.shape == (3000, 32)
    assert _embedding_requests(server) == 3  # 1,000 texts each
    picks = [0, 999, 1000, 2999]
    expected = QueryEncoder.load(served_bundle / "encoder").encode([corpus[i] for i in picks])
    np.testing.assert_allclose(vectors[picks], expected, atol=1e-5)
    query = np.array(emb.embed_query(corpus[5]), dtype=np.float32)
    np.testing.assert_allclose(query, vectors[5], atol=1e-5)


def test_the_token_cap_bounds_a_request_and_names_the_setting(served_bundle: Path, server_factory) -> None:
    server = server_factory(served_bundle, max_embedding_tokens=40)
    r = _post(server, {"input": ["what is a bank"] * 3})
    assert r.status_code == 200, r.text
    tokens = r.json()["usage"]["total_tokens"]
    r = _post(server, {"input": ["what is a bank"] * (40 // (tokens // 3) + 1)})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "too_many_tokens" and error["param"] == "input"
    assert "at most 40 per request (ESP_MAX_EMBEDDING_TOKENS)" in error["message"]
