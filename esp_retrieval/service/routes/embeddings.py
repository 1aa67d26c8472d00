"""``POST /v1/embeddings``: the bundle's query encoder in the OpenAI embeddings shape.

Request ``{"input": "text" | ["text", ...], "model": any string, "encoding_format": "float" |
"base64", "dimensions": D}`` answers ``{"object": "list", "data": [{"object": "embedding",
"embedding": [...], "index": i}], "model": <bundle version>, "usage": {"prompt_tokens",
"total_tokens"}}``, so an OpenAI-compatible client (the ``openai`` package, LangChain,
LlamaIndex) can use the encoder. ``model`` is accepted as any string and ignored: the response
names the bundle version that encoded the texts.

The embedding is the encoder's output, each subspace block L2-normalised and concatenated in
layout order (docs/architecture.md section 1, the score). Two optional extensions choose what
comes back:

- ``subspaces``: only these blocks, concatenated in layout order (a partial vector);
- ``weights`` (by name or in layout order) or ``operating_point``: each block multiplied by its
  weight (block-scaled), so the inner product of such a query embedding with an unweighted
  document embedding is the weighted ESP score ``sum_k w_k cos(q_k, d_k)`` in any
  inner-product vector store. Without either, blocks are not scaled (every weight 1), which is
  what to store for documents.

``base64`` is the little-endian float32 bytes of each vector (what the ``openai`` client asks
for by default). The response also says which blocks it holds (``subspaces`` with their
offsets in the returned vector) and the weights applied (``weights_used``).

What OpenAI clients meet with their defaults: up to ``ESP_MAX_EMBEDDING_INPUTS`` (2,048, as
OpenAI) texts per request, bounded by ``ESP_MAX_EMBEDDING_TOKENS`` tokens summed over the request
(what the encoder sees, truncated at its ``max_length``), so LangChain's ``chunk_size=1000``
fits. Token-id inputs (lists of integers) are refused with a 422 that says what to do: ids of
another tokenizer (tiktoken's) mean other words to this encoder, and LangChain sends them unless
``check_embedding_ctx_length=False``. Requests encode on the bundle's encoder thread through
:class:`esp_retrieval.service.encoder_queue.EncoderQueue`: at most ``ESP_MAX_EMBEDDING_QUEUE`` at once (429
beyond), each answered within ``ESP_EMBEDDING_DEADLINE_SECONDS`` (429 while still waiting, 503
once encoding; the encoding stops before its next batch). ``dimensions`` must equal the
returned width: the vector is a concatenation of unit-norm blocks, so a prefix is no smaller
embedding of the same text (it drops whole subspaces, or cuts one); ``subspaces`` chooses blocks
instead. Errors on these routes
are in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}`` (``esp_retrieval.service.errors``),
except a body over ``ESP_MAX_BODY_BYTES``, refused (413) before routing in this service's shape.
``GET /v1/models`` lists the served encoder, named by its bundle version.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from esp_retrieval.service import sparse_query
from esp_retrieval.service.encoder_queue import EncoderQueue
from esp_retrieval.service.errors import NotFoundError
from esp_retrieval.service.routes.deps import SettingsDep, StateDep
from esp_retrieval.service.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    ModelCard,
    ModelList,
    error_responses,
)
from esp_retrieval.service.search.codec import PydanticJSONResponse
from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.bundle import MANIFEST
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout

router = APIRouter(tags=["embeddings"])


class TooManyTokensError(FieldError):
    """The texts of one embeddings request hold more tokens than ``ESP_MAX_EMBEDDING_TOKENS`` (-> 422)."""

    code = "too_many_tokens"


def selected_blocks(layout: SubspaceLayout, names: list[str] | None) -> list[str]:
    """The layout names asked for, in layout order (all when ``names`` is None)."""
    if names is None:
        return list(layout.names)
    for i, name in enumerate(names):
        if name not in layout:
            raise FieldError(
                f"subspaces[{i}]: unknown subspace {name!r}; valid names: {list(layout.names)}",
                f"subspaces[{i}]",
            )
        if name in names[:i]:
            raise FieldError(f"subspaces[{i}]: {name!r} is listed twice", f"subspaces[{i}]")
    return [n for n in layout.names if n in names]


def shape_vectors(
    vectors: np.ndarray, layout: SubspaceLayout, blocks: list[str], block_weights: np.ndarray | None
) -> np.ndarray:
    """``(n, D)`` block-normalised vectors -> the chosen blocks, each times its weight."""
    parts = []
    for name in blocks:
        part = vectors[:, layout.slice(name)]
        if block_weights is not None:
            part = part * np.float32(block_weights[layout.index(name)])
        parts.append(part)
    return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)


#: texts per encoder call: the encoder's own batch, so that between calls the deadline is checked
#: and the vectors are those one call over all the texts gives (its batches, in its order)
ENCODE_BATCH = 64


def _encode(
    state: ServingState, texts: list[str], max_tokens: int, check: Callable[[], None]
) -> tuple[np.ndarray, int]:
    """Count the tokens first (the cap bounds the encoder's time), then encode a batch at a time,
    calling ``check()`` (:class:`esp_retrieval.service.encoder_queue.EncoderQueue`: the deadline) before each
    (the caller checked that the bundle has an encoder)."""
    assert state.encoder is not None
    check()
    tokens = sum(state.encoder.count_tokens(texts))
    if tokens > max_tokens:
        raise TooManyTokensError(
            f"input: {len(texts)} texts hold {tokens} tokens; at most {max_tokens} per request "
            "(ESP_MAX_EMBEDDING_TOKENS): send fewer texts per request (LangChain: a smaller chunk_size)",
            "input",
        )
    out = np.empty((len(texts), state.layout.dim), np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # the encoder's order (by length)
    for start in range(0, len(order), ENCODE_BATCH):
        check()
        rows = order[start : start + ENCODE_BATCH]
        out[rows] = state.encode([texts[i] for i in rows])
    return out, tokens


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingsResponse,
    responses={**error_responses(422, 429, 503, openai=True), **error_responses(413)},  # 413: before routing
    summary="Encode texts with the bundle's query encoder (OpenAI embeddings shape)",
)
async def embeddings(
    body: EmbeddingsRequest, request: Request, state: StateDep, settings: SettingsDep
) -> PydanticJSONResponse:
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise FieldError("input must hold at least one text", "input")
    if len(texts) > settings.max_embedding_inputs:
        raise FieldError(
            f"input has {len(texts)} texts; at most {settings.max_embedding_inputs} per request "
            "(ESP_MAX_EMBEDDING_INPUTS)", "input",
        )
    if state.encoder is None:
        raise FieldError(f"bundle {state.version} has no query encoder: it cannot embed texts", "input")
    layout = state.layout
    blocks = selected_blocks(layout, body.subspaces)
    out_dim = sum(layout[n].dim for n in blocks)
    if body.dimensions is not None and body.dimensions != out_dim:
        widths = " + ".join(f"{n} {layout[n].dim}" for n in blocks)
        raise FieldError(
            f"dimensions: the vectors are {out_dim} wide ({widths}), each block unit-norm, so a "
            f"{body.dimensions}-wide prefix would drop or cut subspaces rather than give a smaller "
            f"embedding; send {out_dim} or none, or choose blocks with 'subspaces'",
            "dimensions",
        )
    block_weights: np.ndarray | None = None
    weights_used: dict[str, float] | None = None
    point: str | None = None
    if body.weights is not None or body.operating_point is not None:
        resolved = sparse_query.dense_only(request.app.state.registry.current.resolve(
            state.weight_layout, weights=body.weights, operating_point=body.operating_point
        ), layout)
        block_weights, weights_used = resolved.block_weights, resolved.weights_used
        point = resolved.operating_point
    queue: EncoderQueue = request.app.state.embedding_queue
    vectors, tokens = await queue.run(state, _encode, state, texts, settings.max_embedding_tokens)
    shaped = shape_vectors(vectors, layout, blocks, block_weights)
    data: list[dict[str, Any]] = []
    for i, row in enumerate(shaped):
        value: list[float] | str
        if body.encoding_format == "base64":
            value = base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
        else:
            value = row.tolist()
        data.append({"object": "embedding", "embedding": value, "index": i})
    offsets, at = [], 0
    for name in blocks:
        w = 1.0 if block_weights is None else float(block_weights[layout.index(name)])
        offsets.append({"name": name, "offset": at, "dim": layout[name].dim, "weight": w})
        at += layout[name].dim
    return PydanticJSONResponse(
        {
            "object": "list",
            "data": data,
            "model": state.version,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "subspaces": offsets,
            "weights_used": weights_used,
            "operating_point": point,
        }
    )


def _card(state: ServingState) -> ModelCard:
    manifest = state.bundle.path / MANIFEST
    created = int(manifest.stat().st_mtime) if manifest.exists() else 0
    return ModelCard(id=state.version, created=created)


@router.get(
    "/v1/models",
    response_model=ModelList,
    responses=error_responses(503, openai=True),
    summary="The served encoder as an OpenAI model list (one model: the bundle version)",
)
async def list_models(state: StateDep) -> ModelList:
    return ModelList(data=[_card(state)])


@router.get(
    "/v1/models/{model}",
    response_model=ModelCard,
    responses=error_responses(404, 503, openai=True),
    summary="One model of GET /v1/models (404 for any other name)",
)
async def retrieve_model(model: str, state: StateDep) -> ModelCard:
    if model != state.version:
        raise NotFoundError(f"model {model!r} is not served; this service serves {state.version!r}", "model")
    return _card(state)
