"""The routes ask an engine's declared :class:`Capabilities`, never its attributes.

The served numpy engine is swapped for subclasses that declare (or only pretend) a
capability: hits named by the backend, filters compiled against its schema and handed to it
as expressions, live writes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.engine.base import Capabilities, LiveDocument, SearchResult
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from esp_retrieval.subspace.filters import CompiledFilter, MetadataSchema
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
STORE_SCHEMA = MetadataSchema.infer([{"lang": "en"}])


class NamesItsHits(NumpyBackend):
    """Holds its documents: hits are named by it, filters compiled against its schema."""

    name: ClassVar[str] = "names-its-hits"
    capabilities: ClassVar[Capabilities] = Capabilities(metadata=True, native_filters=True)
    metadata_schema = STORE_SCHEMA
    seen: ClassVar[list[Any]] = []

    def search(self, queries: np.ndarray, block_weights: np.ndarray, k: int, allowed: Any = None) -> SearchResult:
        NamesItsHits.seen.append(allowed)
        return super().search(queries, block_weights, k)

    def documents(self, rows: Iterable[int]) -> list[tuple[str, dict[str, Any]]]:
        return [(f"store-{r}", {"title": f"stored {r}"}) for r in rows]


class Pretends(NumpyBackend):
    """Has the attributes the routes once probed for, and declares nothing."""

    name: ClassVar[str] = "pretends"
    writable = True
    native_filters = True
    metadata_schema = STORE_SCHEMA

    def documents(self, rows: Iterable[int]) -> list[tuple[str, dict[str, Any]]]:
        raise AssertionError("not declared: must not be asked")

    def upsert(self, docs: Sequence[LiveDocument]) -> list[int]:
        raise AssertionError("not declared: must not be asked")


class Writes(NumpyBackend):
    name: ClassVar[str] = "writes"
    capabilities: ClassVar[Capabilities] = Capabilities(metadata=True, writes=True)
    metadata_schema = STORE_SCHEMA
    written: ClassVar[list[LiveDocument]] = []

    def upsert(self, docs: Sequence[LiveDocument]) -> list[int]:
        Writes.written.extend(docs)
        return list(range(len(docs)))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("caps")
    emb = normalize_blocks(np.random.default_rng(0).standard_normal((40, LAYOUT.dim)).astype(np.float32), LAYOUT)
    bundle = write_bundle(root / "b", LAYOUT, emb, [f"d{i}" for i in range(40)])
    settings = Settings(bundle=bundle, backend="numpy", threads=1, admin_token=TOKEN)
    app = create_app(settings)
    with TestClient(app) as c:
        deadline = time.monotonic() + 60
        while app.state.holder.current is None:  # the bundle loads on the loader thread
            assert time.monotonic() < deadline, "the bundle did not load"
            time.sleep(0.01)
        yield c


def _serve(client: TestClient, cls: type[NumpyBackend]) -> None:
    holder = client.app.state.holder  # type: ignore[attr-defined]
    state = holder.current
    engine = cls(state.bundle.embeddings, LAYOUT, threads=1)
    holder.current = dataclasses.replace(state, engine=engine)


def _search(client: TestClient, **extra: Any) -> Any:
    body = {"queries": [{"vector": [1.0] * LAYOUT.dim}], "k": 3, **extra}
    return client.post("/v1/search", json=body)


def test_a_backend_that_declares_metadata_names_the_hits_and_takes_filters(client: TestClient) -> None:
    _serve(client, NamesItsHits)
    r = _search(client)
    assert r.status_code == 200, r.text
    hits = r.json()["results"][0]["hits"]
    assert len(hits) == 3 and all(h["id"].startswith("store-") for h in hits)
    # "lang" is the backend's field, not the bundle's (which has no docs.jsonl)
    r = _search(client, filter={"field": "lang", "eq": "en"})
    assert r.status_code == 200, r.text
    assert isinstance(NamesItsHits.seen[-1], CompiledFilter)  # native: the compiled filter itself


def test_attributes_without_a_declaration_are_not_capabilities(client: TestClient) -> None:
    _serve(client, Pretends)
    r = _search(client)
    assert r.status_code == 200, r.text
    assert all(h["id"].startswith("d") for h in r.json()["results"][0]["hits"])  # the bundle's ids
    assert _search(client, filter={"field": "lang", "eq": "en"}).status_code == 422  # not the bundle's field
    doc = {"documents": [{"id": "x", "vector": [1.0] * LAYOUT.dim}]}
    r = client.post("/v1/documents", json=doc, headers=ADMIN)
    assert r.status_code == 409, r.text


def test_a_backend_that_declares_writes_takes_them(client: TestClient) -> None:
    _serve(client, Writes)
    doc = {"documents": [{"id": "x", "vector": [1.0] * LAYOUT.dim, "fields": {"lang": "de"}}]}
    r = client.post("/v1/documents", json=doc, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["backend"] == "writes"
    [written] = Writes.written
    assert written.id == "x" and written.fields == {"lang": "de"} and written.vector.shape == (LAYOUT.dim,)


class Asymmetric:
    """An encoder whose documents and queries are embedded differently (a document side of its
    own): each side gives its own constant vector."""

    layout = LAYOUT
    query = normalize_blocks(np.ones((1, LAYOUT.dim), np.float32), LAYOUT)[0]
    document = normalize_blocks(np.arange(1, LAYOUT.dim + 1, dtype=np.float32)[None, :], LAYOUT)[0]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.tile(self.query, (len(texts), 1))

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.tile(self.document, (len(texts), 1))


def test_a_written_text_goes_through_the_document_encoder(client: TestClient) -> None:
    _serve(client, Writes)
    holder = client.app.state.holder  # type: ignore[attr-defined]
    holder.current = dataclasses.replace(holder.current, encoder=Asymmetric())
    Writes.written.clear()
    r = client.post("/v1/documents", json={"documents": [{"id": "t", "text": "a document"}]}, headers=ADMIN)
    assert r.status_code == 200, r.text
    [written] = Writes.written
    np.testing.assert_array_equal(written.vector, Asymmetric.document)  # not the query side
