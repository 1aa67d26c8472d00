"""The milvus backend behind the real server (Milvus Lite file): filters, live writes, persistence.

The bundle is written into the collection by ``esp milvus-load`` (a subprocess, as an operator
would), then served with ``ESP_BACKEND=milvus``. Upsert -> the next search sees it; delete ->
gone; restart -> still there; a bad filter is 422 naming the field; writes to the in-process
(numpy) server are 409.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench.live_server import LiveServer, child_env, start_milvus_lite, start_server
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores
from tests.live_fixtures import SERVER_DEFAULTS

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

LANGS = ("en", "de", "fr")


def _docs(n: int) -> list[dict[str, Any]]:
    return [
        {
            "text": f"document number {i}",
            "title": f"title {i}",
            "lang": LANGS[i % 3],
            "year": 2000 + (i * 7) % 25,
            "published": f"20{10 + i % 15:02d}-0{1 + i % 9}-15",
            **({"score": i / 10} if i % 4 else {}),
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def milvus_bundle(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = read_bundle(tiny_bundle)
    sections = {
        k: v
        for k, v in src.manifest.items()
        if k not in {"format_version", "version", "layout", "corpus", "files"}
    }
    out = tmp_path_factory.mktemp("milvus-bundle") / "bundle"
    return write_bundle(
        out,
        src.layout,
        np.asarray(src.embeddings),
        src.ids,
        docs=_docs(len(src.ids)),
        encoder_dir=src.encoder_dir,
        sections=sections,
    )


def _load(bundle: Path, uri: Path | str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "esp_retrieval.cli", "milvus-load", str(bundle), "--uri", str(uri), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _serve(bundle: Path, log_dir: Path, token: str, db: Path | str) -> LiveServer:
    """A milvus-backed server; readiness may take long on a loaded machine (torch import, encoder)."""
    settings = {**SERVER_DEFAULTS, "backend": "milvus", "milvus_uri": db, "milvus_collection": "esp"}
    log_dir.mkdir(parents=True, exist_ok=True)
    return start_server(bundle, log_dir / "server.log", settings=settings, token=token, ready_timeout=300)


def _search(server: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/search", json=body, timeout=60)


def _expected(bundle: Path, q: np.ndarray, weights: np.ndarray, mask: np.ndarray, k: int) -> list[str]:
    b = read_bundle(bundle)
    s = reference_scores(q[None, :], np.asarray(b.embeddings), weights, b.layout)[0]
    s = np.where(mask, s, -np.inf)
    order = np.argsort(-s, kind="stable")[: min(k, int(mask.sum()))]
    return [b.ids[i] for i in order]


@pytest.mark.live  # esp serve on Milvus Lite, started here
@pytest.mark.slow
def test_milvus_server_filters_writes_and_persists(
    milvus_bundle: Path,
    tmp_path: Path,
    admin_token: str,
) -> None:
    db = tmp_path / "esp.db"
    loaded = _load(milvus_bundle, db)
    b = read_bundle(milvus_bundle)
    n, layout = len(b.ids), b.layout
    assert loaded["rows"] == n and loaded["index"] == "FLAT"
    assert loaded["metadata_fields"]["year"] == "int" and loaded["metadata_fields"]["published"] == "date"
    assert _load(milvus_bundle, db)["resumed_at"] == n  # a rerun finds every row written: nothing to do

    with _serve(milvus_bundle, tmp_path / "log1", admin_token, db) as server:
        auth = {"Authorization": f"Bearer {admin_token}"}
        rng = np.random.default_rng(7)
        q = normalize_blocks(rng.standard_normal((1, layout.dim)).astype(np.float32), layout)[0]
        w = np.linspace(1.0, 0.25, len(layout))
        weights = dict(zip(layout.names, w.tolist(), strict=True))
        docs = _docs(n)

        # a filter: the exact filtered top k, as a masked brute force says
        flt = {"and": [{"field": "lang", "in": ["en", "fr"]}, {"not": {"field": "year", "lt": 2010}}]}
        mask = np.array([d["lang"] in ("en", "fr") and not d["year"] < 2010 for d in docs])
        r = _search(server, {"queries": [{"vector": q.tolist()}], "k": 10, "weights": weights, "filter": flt})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["backend"] == "milvus"
        assert [h["id"] for h in body["results"][0]["hits"]] == _expected(milvus_bundle, q, w, mask, 10)
        assert body["results"][0]["hits"][0]["text"].startswith("document number")
        dated = {"field": "published", "gte": "2015-01-01", "lt": "2020-01-01T00:00:00Z"}
        r = _search(
            server, {"queries": [{"vector": q.tolist()}], "k": 5, "weights": weights, "filter": dated}
        )
        mask = np.array(["2015-01-01" <= d["published"] < "2020-01-01" for d in docs])
        assert [h["id"] for h in r.json()["results"][0]["hits"]] == _expected(milvus_bundle, q, w, mask, 5)

        # bad filters: 422 naming the field
        for bad, field in (
            ({"field": "nope", "eq": 1}, "filter.field"),
            ({"or": [{"field": "year", "eq": "x"}]}, "filter.or[0].eq"),
            ({"field": "lang", "gt": 3}, "filter.gt"),
        ):
            r = _search(server, {"queries": [{"vector": q.tolist()}], "filter": bad})
            assert r.status_code == 422, r.text
            assert r.json()["field"] == field

        # upsert: the next search sees it (a vector equal to the query is the top hit)
        doc = {
            "id": "live-1",
            "vector": q.tolist(),
            "text": "a live document",
            "fields": {"lang": "de", "year": 2024},
        }
        assert (
            httpx.post(f"{server.url}/v1/documents", json={"documents": [doc]}, timeout=60).status_code == 401
        )
        r = httpx.post(f"{server.url}/v1/documents", json={"documents": [doc]}, headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["consistency"] == "Strong"
        top = _search(server, {"queries": [{"vector": q.tolist()}], "k": 3, "weights": weights}).json()
        assert top["results"][0]["hits"][0]["id"] == "live-1"
        assert top["results"][0]["hits"][0]["text"] == "a live document"
        assert top["results"][0]["hits"][0]["score"] == pytest.approx(float(w.sum()), abs=1e-5)
        only_de = {"field": "lang", "eq": "de"}
        hits = _search(server, {"queries": [{"vector": q.tolist()}], "k": 1, "filter": only_de}).json()
        assert hits["results"][0]["hits"][0]["id"] == "live-1"
        hits = _search(
            server, {"queries": [{"vector": q.tolist()}], "k": 1, "filter": {"not": only_de}}
        ).json()
        assert hits["results"][0]["hits"][0]["id"] != "live-1"
        # a text document: encoded by the bundle's encoder
        r = httpx.post(
            f"{server.url}/v1/documents",
            json={"documents": [{"id": "live-2", "text": "encoded text", "fields": {"year": 1999}}]},
            headers=auth,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        hits = _search(
            server, {"queries": [{"text": "encoded text"}], "k": 1, "filter": {"field": "year", "eq": 1999}}
        ).json()
        assert [h["id"] for h in hits["results"][0]["hits"]] == ["live-2"]
        same = sum(
            hits["weights_used"].values()
        )  # the query's encoding is the document's: cosine 1 per block
        assert hits["results"][0]["hits"][0]["score"] == pytest.approx(same, abs=1e-4)
        r = httpx.post(
            f"{server.url}/v1/documents",
            json={"documents": [{"id": "x", "vector": q.tolist(), "fields": {"colour": "red"}}]},
            headers=auth,
            timeout=60,
        )
        assert r.status_code == 422 and r.json()["field"] == "documents[0].fields.colour"

        # delete: gone from the next search; a second delete is 404
        assert httpx.delete(f"{server.url}/v1/documents/live-1", headers=auth, timeout=60).status_code == 200
        top = _search(server, {"queries": [{"vector": q.tolist()}], "k": 3, "weights": weights}).json()
        assert "live-1" not in [h["id"] for h in top["results"][0]["hits"]]
        assert httpx.delete(f"{server.url}/v1/documents/live-1", headers=auth, timeout=60).status_code == 404

    # restart: the live write is still there (persisted in the collection)
    with _serve(milvus_bundle, tmp_path / "log2", admin_token, db) as again:
        hits = _search(
            again, {"queries": [{"vector": q.tolist()}], "k": 1, "filter": {"field": "year", "eq": 1999}}
        ).json()
        assert [h["id"] for h in hits["results"][0]["hits"]] == ["live-2"]
        top = _search(again, {"queries": [{"vector": q.tolist()}], "k": 3, "weights": weights}).json()
        assert "live-1" not in [h["id"] for h in top["results"][0]["hits"]]


@pytest.mark.live  # esp milvus-lite and two esp serve replicas over it, started here
@pytest.mark.slow
def test_two_replicas_over_one_milvus_serve_each_others_writes(
    milvus_bundle: Path, tmp_path: Path, admin_token: str
) -> None:
    b = read_bundle(milvus_bundle)
    layout, target = b.layout, b.ids[3]
    w = np.linspace(1.0, 0.25, len(layout))
    weights = dict(zip(layout.names, w.tolist(), strict=True))
    auth = {"Authorization": f"Bearer {admin_token}"}
    rng = np.random.default_rng(11)
    q = normalize_blocks(rng.standard_normal((2, layout.dim)).astype(np.float32), layout)

    def top(server: LiveServer, vector: np.ndarray) -> dict[str, Any]:
        r = _search(server, {"queries": [{"vector": vector.tolist()}], "k": 1, "weights": weights})
        assert r.status_code == 200, r.text
        return dict(r.json()["results"][0]["hits"][0])

    def write(server: LiveServer, doc: dict[str, Any]) -> None:
        r = httpx.post(f"{server.url}/v1/documents", json={"documents": [doc]}, headers=auth, timeout=60)
        assert r.status_code == 200, r.text

    with start_milvus_lite(tmp_path / "shared.db", tmp_path / "lite.log") as milvus:
        assert _load(milvus_bundle, milvus.url)["rows"] == len(b.ids)
        with (
            _serve(milvus_bundle, tmp_path / "a", admin_token, milvus.url) as a,
            _serve(milvus_bundle, tmp_path / "b", admin_token, milvus.url) as b_server,
        ):
            before = top(b_server, np.asarray(b.embeddings[3], np.float32))
            assert (before["id"], before["text"]) == (target, "document number 3")  # B has shown it
            # A rewrites it (new text, new vector): B serves the new id, text and vector
            write(
                a, {"id": target, "vector": q[0].tolist(), "text": "rewritten on A", "fields": {"year": 1990}}
            )
            hit = top(b_server, q[0])
            assert (hit["id"], hit["text"]) == (target, "rewritten on A")
            assert hit["score"] == pytest.approx(
                float(w.sum()), abs=1e-5
            )  # cosine 1 per block: the new vector
            assert top(b_server, np.asarray(b.embeddings[3], np.float32))["id"] != target
            # a new document on B is served by A; deleted on A, it is gone from B
            write(b_server, {"id": "from-b", "vector": q[1].tolist(), "text": "written on B"})
            hit = top(a, q[1])
            assert (hit["id"], hit["text"]) == ("from-b", "written on B")
            assert hit["score"] == pytest.approx(float(w.sum()), abs=1e-5)
            assert httpx.delete(f"{a.url}/v1/documents/from-b", headers=auth, timeout=60).status_code == 200
            assert top(b_server, q[1])["id"] != "from-b"


def test_writes_to_an_in_process_backend_are_409(served: LiveServer, admin_token: str) -> None:
    auth = {"Authorization": f"Bearer {admin_token}"}
    doc = {"id": "x", "text": "hello"}
    r = httpx.post(f"{served.url}/v1/documents", json={"documents": [doc]}, headers=auth, timeout=30)
    assert r.status_code == 409, r.text
    assert r.json()["type"] == "read_only_index" and "reload" in r.json()["message"]
    r = httpx.delete(f"{served.url}/v1/documents/x", headers=auth, timeout=30)
    assert r.status_code == 409


def test_a_filter_on_the_numpy_server_is_exact_and_checked(served: LiveServer, served_bundle: Path) -> None:
    b = read_bundle(served_bundle)
    docs = b.docs() or []
    fields = {k for d in docs for k in d}
    assert "text" in fields
    target = docs[3]["text"]
    fields = httpx.get(f"{served.url}/v1/layout", timeout=30).json()["metadata_fields"]
    assert fields["text"] == "text"  # listed for clients: returned, not filterable (not declared)
    q = normalize_blocks(
        np.random.default_rng(3).standard_normal((1, b.layout.dim)).astype(np.float32), b.layout
    )
    r = _search(
        served, {"queries": [{"vector": q[0].tolist()}], "k": 5, "filter": {"field": "text", "eq": target}}
    )
    assert r.status_code == 422 and r.json()["field"] == "filter.field", r.text
    assert "not filterable" in r.json()["message"]
    r = _search(served, {"queries": [{"vector": q[0].tolist()}], "k": 5, "fields": ["text"]})
    assert r.status_code == 200, r.text  # still returned when asked for
    assert all(isinstance(h["fields"]["text"], str) for h in r.json()["results"][0]["hits"])
    r = _search(served, {"queries": [{"vector": q[0].tolist()}], "filter": {"field": "year", "eq": 1}})
    assert r.status_code == 422 and r.json()["field"] == "filter.field"
