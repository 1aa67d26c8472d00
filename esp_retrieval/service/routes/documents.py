"""Live writes behind the admin token: ``POST /v1/documents`` (upsert) and ``DELETE /v1/documents/{id}``.

Only a backend that declares writes (``capabilities.writes``: the ``milvus`` backend) takes
writes; they are visible to every search that starts after the call returns (Milvus
consistency level ``Strong`` on writes and searches). The in-process backends serve a bundle's
immutable index and answer 409 (:class:`~esp_retrieval.service.errors.ReadOnlyIndexError`): rebuild the
bundle and reload it. A document is an ``id``, a ``vector`` (full or per subspace, normalised
per block like a query) or a ``text`` (encoded by the bundle's document encoder, as the corpus
was: ``ServingState.encode_documents``), and metadata ``fields`` among those the collection
declares (``text`` is also stored when declared). The token is checked from the headers before
the body is read or parsed
(:class:`~esp_retrieval.service.routes.admin.AdminRoute`, as on the admin routes): without it, 401 or 403,
never a judgement of the body.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Path

from esp_retrieval.service.errors import NotFoundError, ReadOnlyIndexError
from esp_retrieval.service.routes.admin import AdminRoute, require_admin
from esp_retrieval.service.routes.deps import StateDep
from esp_retrieval.service.schemas import (
    MAX_ID_CHARS,
    DeleteResponse,
    UpsertRequest,
    UpsertResponse,
    error_responses,
)
from esp_retrieval.service.search.results import query_vector
from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.engine.base import Backend, LiveDocument
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.filters import coerce_value
from esp_retrieval.subspace.scoring import normalize_blocks

CONSISTENCY = "Strong"

router = APIRouter(tags=["documents"], dependencies=[Depends(require_admin)], route_class=AdminRoute)


def _writable(state: ServingState) -> Backend:
    engine = state.engine
    if not engine.capabilities.writes:
        raise ReadOnlyIndexError(
            f"the {engine.name} backend serves bundle {state.version} as an immutable in-process index: "
            "rebuild the bundle and reload it (POST /v1/admin/reload), or serve from Milvus "
            "(ESP_BACKEND=milvus) to write documents live"
        )
    return engine


def _vectors(body: UpsertRequest, state: ServingState) -> np.ndarray:
    layout = state.layout
    out = np.empty((len(body.documents), layout.dim), np.float32)
    given = [i for i, d in enumerate(body.documents) if d.vector is not None]
    texts = [i for i, d in enumerate(body.documents) if d.vector is None]
    if given:
        raw = np.stack(
            [query_vector(body.documents[i].vector, layout, f"documents[{i}].vector") for i in given]  # type: ignore[arg-type]
        )
        out[given] = normalize_blocks(raw, layout, prescale=True)
    if texts:
        if state.encoder is None:
            raise FieldError(
                f"bundle {state.version} has no encoder: send a vector for each document",
                f"documents[{texts[0]}].vector",
            )
        out[texts] = state.encode_documents([body.documents[i].text for i in texts])  # type: ignore[misc]
    return out


def _fields(body: UpsertRequest, schema: Any) -> list[dict[str, Any]]:
    out = []
    for i, d in enumerate(body.documents):
        values: dict[str, Any] = {}
        for name, value in d.fields.items():
            where = f"documents[{i}].fields.{name}"
            if name not in schema:
                raise FieldError(
                    f"{where}: {name!r} is not a metadata field of the collection; "
                    f"declared: {schema.names()}",
                    where,
                )
            if value is not None:
                coerce_value(schema.fields[name], value, where)
            values[name] = value
        if d.text is not None and "text" in schema and "text" not in values:
            values["text"] = d.text
        out.append(values)
    return out


@router.post(
    "/v1/documents",
    response_model=UpsertResponse,
    responses=error_responses(401, 403, 404, 409, 413, 422, 503),
    summary="Insert or replace documents by id (writable backends: milvus); visible to the next search",
)
async def upsert_documents(body: UpsertRequest, state: StateDep) -> UpsertResponse:
    engine = _writable(state)
    fields = _fields(body, engine.metadata_schema)
    vectors = await state.in_encoder_thread(_vectors, body, state)
    docs = [LiveDocument(d.id, vectors[i], fields[i]) for i, d in enumerate(body.documents)]
    await asyncio.to_thread(engine.upsert, docs)
    return UpsertResponse(
        upserted=len(docs), ids=[d.id for d in docs], backend=engine.name, consistency=CONSISTENCY
    )


@router.delete(
    "/v1/documents/{doc_id}",
    response_model=DeleteResponse,
    responses=error_responses(401, 403, 404, 409, 503),
    summary="Delete a document by id (writable backends: milvus); gone from the next search",
)
async def delete_document(
    doc_id: Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)], state: StateDep
) -> DeleteResponse:
    engine = _writable(state)
    if not await asyncio.to_thread(engine.delete, doc_id):
        raise NotFoundError(f"no document with id {doc_id!r}", "doc_id")
    return DeleteResponse(deleted=doc_id, backend=engine.name, consistency=CONSISTENCY)
