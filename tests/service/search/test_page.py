"""``offset``, ``score_threshold`` and ``fields`` on ``POST /v1/search``, on the numpy, ivf and
milvus backends (in-process app; Milvus Lite, the embedded engine, holds the collection).

One bundle of :data:`~esp_retrieval.subspace.engine.ivf.EXACT_BELOW` rows, so the ``ivf`` backend probes its
index (no exact fallback). Per backend: page 2 is hits ``k .. 2k`` of one search for ``2k``,
the threshold keeps exactly the hits scoring at least it, ``fields`` gives exactly the fields
asked for in their metadata types; the bounds and unknown fields are 422 naming the field.
Across backends the fields of a document are the same values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.engine.ivf import EXACT_BELOW
from esp_retrieval.subspace.filters import MetadataSchema, format_date, parse_date
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
N = EXACT_BELOW
MAX_K = 40
WEIGHTS = {"semantic": 1.0, "entity": 0.4}
BACKENDS = ("numpy", "ivf", "milvus")
LANGS = ("en", "de", "fr")


def _doc(i: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "text": f"passage {i}",
        "lang": LANGS[i % 3],
        "year": 1990 + i % 35,
        "published": f"20{10 + i % 15:02d}-{1 + i % 12:02d}-{1 + i % 28:02d}",
        "rating": i % 7 / 2,  # 0.0 .. 3.0
        "bucket": i % 2000,  # 25 documents each
    }
    if i % 5:  # some documents have no flag
        doc["flag"] = bool(i % 2)
    return doc


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    emb = normalize_blocks(np.random.default_rng(5).standard_normal((N, LAYOUT.dim)).astype(np.float32), LAYOUT)
    docs = [_doc(i) for i in range(N)]
    docs[3] = {**docs[3], "rating": 2}  # a whole number written as an int: the schema says float
    return write_bundle(
        tmp_path_factory.mktemp("page") / "bundle", LAYOUT, emb, [f"d{i}" for i in range(N)], docs=docs
    )


def _serve(settings: Settings) -> Iterator[TestClient]:
    app: FastAPI = create_app(settings)
    with TestClient(app) as c:
        for _ in range(1200):
            if c.get("/readyz").status_code == 200:
                break
        else:
            pytest.fail(f"not ready: {c.get('/readyz').text}")
        yield c


@pytest.fixture(scope="module", params=BACKENDS)
def client(request: pytest.FixtureRequest, bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    backend = request.param
    settings = Settings(  # a latency budget no shared test machine exceeds: admission is not tested here
        bundle=bundle, backend=backend, threads=1, max_k=MAX_K, max_queries=4, max_hits=100, batching=False,
        latency_budget_ms=600_000,
    )
    if backend != "milvus":
        yield from _serve(settings)
        return
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    from esp_retrieval.service.engine.milvus_backend import MilvusSettings, load_bundle
    from esp_retrieval.subspace.bundle import read_bundle

    b = read_bundle(bundle)
    uri = str(tmp_path_factory.mktemp("milvus") / "page.db")
    with pytest.MonkeyPatch.context() as env:  # the backend reads ESP_MILVUS_* itself
        env.setenv("ESP_MILVUS_URI", uri)
        env.setenv("ESP_MILVUS_COLLECTION", "page")
        ms = MilvusSettings()
        docs = b.docs()
        load_bundle(ms, b.layout, np.asarray(b.embeddings), b.ids, docs, schema=MetadataSchema.infer(docs))
        yield from _serve(settings)


def _query(seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(LAYOUT.dim).tolist()


def _search(client: TestClient, **body: Any) -> Any:
    body = {"queries": [{"vector": _query(1)}], "weights": WEIGHTS, **body}
    return client.post("/v1/search", content=json.dumps(body), headers={"content-type": "application/json"})


def _state(client: TestClient) -> Any:
    return client.app.state.holder.current


def _hits(client: TestClient, **body: Any) -> list[list[dict[str, Any]]]:
    r = _search(client, **body)
    assert r.status_code == 200, r.text
    return [res["hits"] for res in r.json()["results"]]


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """The same hits: ids, scores and fields exactly; the float32 per-subspace cosines within a
    few ulps (their float32 sums follow the shape of the batch of hits they are computed in)."""
    def plain(h: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in h.items() if k != "subspace_scores"}

    return [plain(h) for h in got] == [plain(h) for h in want] and all(
        g["subspace_scores"] == pytest.approx(w["subspace_scores"], rel=1e-6, abs=1e-6)
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("k", [1, 7])
def test_page_two_is_hits_k_to_2k_of_one_larger_search(client: TestClient, k: int) -> None:
    engine = _state(client).engine
    assert _search(client, k=1).json()["backend"] == engine.name
    assert engine.name != "ivf" or engine.fallback is None  # ivf probes its index, not the exact scan
    queries = [{"vector": _query(1)}, {"vector": _query(2)}]
    larger = _hits(client, queries=queries, k=3 * k)
    for page in range(3):
        got = _hits(client, queries=queries, k=k, offset=page * k)
        for g, hits in zip(got, larger, strict=True):
            assert _same(g, hits[page * k : (page + 1) * k])
    assert len({h["id"] for hits in larger for h in hits}) == 2 * 3 * k


def test_pages_of_an_exact_backend_follow_the_brute_force_ranking(client: TestClient) -> None:
    state = _state(client)
    if state.engine.name == "ivf":
        pytest.skip("approximate: its pages are those of its own larger search (above)")
    w = np.array([WEIGHTS[n] for n in LAYOUT.names])
    q = normalize_blocks(np.asarray([_query(1)], np.float32), LAYOUT)
    scores = reference_scores(q, np.asarray(state.bundle.embeddings), w, LAYOUT)[0]
    order = np.argsort(-scores, kind="stable")
    got = _hits(client, k=10, offset=25)[0]
    assert [h["id"] for h in got] == [f"d{i}" for i in order[25:35]]


def test_an_offset_past_the_matches_returns_what_is_left(client: TestClient) -> None:
    only = {"field": "bucket", "eq": 7}
    every = _hits(client, k=MAX_K, filter=only)[0]
    assert len(every) == N // 2000 < MAX_K
    assert _same(_hits(client, k=5, offset=len(every) - 2, filter=only)[0], every[-2:])


def test_the_threshold_keeps_exactly_the_hits_scoring_at_least_it(client: TestClient) -> None:
    larger = _hits(client, k=30)[0]
    scores = [h["score"] for h in larger]
    assert scores == sorted(scores, reverse=True)
    for t in (scores[9], np.nextafter(scores[9], np.inf), scores[0], np.nextafter(scores[0], np.inf), -10.0):
        got = _hits(client, k=30, score_threshold=float(t))[0]
        assert _same(got, [h for h in larger if h["score"] >= t])
    # after an offset: the page, cut at the threshold
    got = _hits(client, k=10, offset=5, score_threshold=scores[11])[0]
    assert _same(got, larger[5:12])


def test_fields_selects_exactly_the_fields_asked_for_in_their_types(client: TestClient) -> None:
    asked = ["year", "published", "flag", "rating", "lang"]
    hits = _hits(client, k=20, fields=asked)[0]
    assert len(hits) == 20
    for h in hits:
        assert set(h) == {"id", "score", "subspace_scores", "fields"}  # no display text either
        assert list(h["fields"]) == asked
        doc = _doc(int(h["id"][1:]))
        if h["id"] == "d3":
            doc["rating"] = 2
        assert h["fields"]["year"] == doc["year"] and isinstance(h["fields"]["year"], int)
        assert h["fields"]["published"] == format_date(parse_date(doc["published"]))
        assert h["fields"]["flag"] == doc.get("flag")  # null where a document has none
        assert h["fields"]["rating"] == float(doc["rating"]) and isinstance(h["fields"]["rating"], float)
        assert h["fields"]["lang"] == doc["lang"]
    assert any(h["fields"]["flag"] is None for h in hits) and any(h["fields"]["flag"] for h in hits)
    none = _hits(client, k=3, fields=[])[0]
    assert [set(h) for h in none] == [{"id", "score", "subspace_scores", "fields"}] * 3
    assert [h["fields"] for h in none] == [{}] * 3
    text = _hits(client, k=3, fields=["text"])[0]
    assert [h["fields"] for h in text] == [{"text": f"passage {h['id'][1:]}"} for h in text]
    plain = _hits(client, k=3)[0]  # without fields: the display text, as before
    assert [h["text"] for h in plain] == [f"passage {h['id'][1:]}" for h in plain] and "fields" not in plain[0]


def test_a_whole_number_of_a_float_field_is_a_float(client: TestClient) -> None:
    vector = np.asarray(_state(client).bundle.embeddings[3]).tolist()  # d3's rating is written 2
    hits = _hits(client, queries=[{"vector": vector}], k=1, fields=["rating"])[0]
    assert [(h["id"], h["fields"]) for h in hits] == [("d3", {"rating": 2.0})]
    assert isinstance(hits[0]["fields"]["rating"], float)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"k": 30, "offset": 11}, "offset", ["offset + k", f"at most {MAX_K}", "ESP_MAX_K"]),
        ({"k": 10, "offset": MAX_K}, "offset", ["offset + k", "= 50"]),
        ({"queries": [{"vector": _query(1)}] * 4, "k": 10, "offset": 20}, "offset", ["ESP_MAX_HITS", "120"]),
        ({"offset": -1}, "offset", ["greater than or equal to 0"]),
        ({"offset": 1.5}, "offset", ["valid integer"]),
        ({"offset": True}, "offset", ["valid integer"]),
        ({"score_threshold": "0.5"}, "score_threshold", ["valid number"]),
        ({"score_threshold": True}, "score_threshold", ["valid number"]),
        ({"fields": ["year", "colour"]}, "fields[1]", ["'colour'", "allowed", "'year'", "'published'", "'flag'"]),
        ({"fields": ["esp_row"]}, "fields[0]", ["'esp_row'", "allowed"]),
        ({"fields": "year"}, "fields", ["valid list"]),
        ({"fields": [""]}, "fields[0]", ["at least 1 character"]),
    ],
)
def test_bad_pages_and_fields_are_422_naming_the_field(
    client: TestClient, body: dict[str, Any], field: str, words: list[str]
) -> None:
    r = _search(client, **body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    for w in words:
        assert w in r.json()["message"]


def test_the_threshold_takes_an_integer_and_refuses_nan(client: TestClient) -> None:
    assert _search(client, k=2, score_threshold=-5).status_code == 200
    raw = json.dumps({"queries": [{"vector": _query(1)}]})[:-1] + ', "score_threshold": NaN}'
    r = client.post("/v1/search", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "score_threshold"


_SEEN: dict[str, dict[str, Any]] = {}


def test_every_backend_returns_the_same_field_values(client: TestClient) -> None:
    """Each backend's fields of a document equal the others' (the milvus collection stores a
    date as microseconds and every number of a float field as a double; the hit says the same)."""
    name = _state(client).engine.name
    asked = ["published", "rating", "flag", "year", "text"]
    hits = _hits(client, queries=[{"vector": _query(s)} for s in (1, 2, 3, 4)], k=10, fields=asked)
    _SEEN[name] = {h["id"]: h["fields"] for q in hits for h in q}
    for other, fields in _SEEN.items():
        shared = fields.keys() & _SEEN[name].keys()
        assert shared, other
        assert {i: fields[i] for i in shared} == {i: _SEEN[name][i] for i in shared}, (name, other)
