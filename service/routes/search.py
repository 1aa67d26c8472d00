"""``POST /v1/search``: validate, resolve weights, queue on the micro-batcher, build the hits.

Each request captures the served state once; its vectors are validated against that state's
layout and scored on that state, even if a hot reload swaps the bundle meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.batching import QueryHits, QueryInput
from service.errors import ErrorKind, ServiceError
from service.metrics import Metrics
from service.routes.deps import BatcherDep, MetricsDep, SettingsDep, StateDep
from service.schemas import Query, SearchRequest, SearchResponse, error_responses
from service.state import ServingState
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

router = APIRouter(tags=["search"])

#: Responses with more hits than this are built on a worker thread, off the event loop.
_BUILD_INLINE_MAX_HITS = 4096
_DOC_FIELDS = ("text", "title", "url")


def _invalid(message: str, field: str) -> ServiceError:
    return ServiceError(ErrorKind.VALIDATION, message, field)


def _layout_desc(layout: SubspaceLayout) -> str:
    return ", ".join(f"{n}:{d}" for n, d in zip(layout.names, layout.dims, strict=True))


def query_vector(
    vector: list[float] | dict[str, list[float]], layout: SubspaceLayout, field: str
) -> np.ndarray:
    """A request vector (full or per subspace) -> ``(D,)`` float32, each block L2-normalised."""
    if isinstance(vector, dict):
        out = np.zeros(layout.dim, dtype=np.float64)
        for name, block in vector.items():
            if name not in layout:
                raise _invalid(
                    f"{field} has unknown subspace {name!r}; valid names: {list(layout.names)}",
                    f"{field}.{name}",
                )
            if len(block) != layout[name].dim:
                raise _invalid(
                    f"{field}.{name} has {len(block)} components; subspace {name!r} has dim "
                    f"{layout[name].dim}",
                    f"{field}.{name}",
                )
            out[layout.slice(name)] = block
    else:
        if len(vector) != layout.dim:
            raise _invalid(
                f"{field} has {len(vector)} components; the layout has D={layout.dim} "
                f"({_layout_desc(layout)}), or send an object by subspace name",
                field,
            )
        out = np.asarray(vector, dtype=np.float64)
    # Scale each block by its largest magnitude first so huge (finite) inputs cannot overflow.
    for obj in layout:
        peak = np.abs(out[obj.offset : obj.end]).max()
        if peak > 0:
            out[obj.offset : obj.end] /= peak
    normed = normalize_blocks(out[None, :], layout)[0].astype(np.float32)
    if not np.any(normed):
        raise _invalid(f"{field} is all zero: at least one subspace block must be non-zero", field)
    return normed


def prepare_queries(queries: list[Query], state: ServingState) -> list[QueryInput]:
    out = []
    for i, q in enumerate(queries):
        field = f"queries[{i}]"
        if q.text is not None:
            if state.encoder is None:
                raise _invalid(
                    f"bundle {state.version} has no query encoder: send vectors instead of text",
                    f"{field}.text",
                )
            out.append(QueryInput(text=q.text))
        else:
            assert q.vector is not None  # the schema guarantees exactly one
            out.append(QueryInput(vector=query_vector(q.vector, state.layout, f"{field}.vector")))
    return out


def _hit(state: ServingState, row: int, score: float, sub: list[float]) -> dict[str, Any]:
    hit: dict[str, Any] = {
        "id": state.bundle.ids[row],
        "score": score,
        "subspace_scores": dict(zip(state.layout.names, sub, strict=True)),
    }
    if state.docs is not None:
        doc = state.docs[row]
        for key in _DOC_FIELDS:
            value = doc.get(key)
            if isinstance(value, str):
                hit[key] = value
    return hit


def build_results(state: ServingState, hits: list[QueryHits]) -> list[dict[str, Any]]:
    return [
        {
            "hits": [
                _hit(state, row, score, sub)
                for row, score, sub in zip(
                    h.rows.tolist(), h.scores.tolist(), h.subspace_scores.tolist(), strict=True
                )
            ]
        }
        for h in hits
    ]


def _observe_weights(metrics: Metrics, layout: SubspaceLayout, block_weights: np.ndarray, n: int) -> None:
    for name, w in zip(layout.names, block_weights.tolist(), strict=True):
        hist = metrics.weights_requested.labels(subspace=name)
        for _ in range(n):
            hist.observe(w)


@router.post(
    "/v1/search",
    response_model=SearchResponse,
    responses=error_responses(413, 422, 429, 503),
    summary="Exact weighted top-k over all subspaces, weights chosen per request",
)
async def search(
    body: SearchRequest,
    request: Request,
    *,
    state: StateDep,
    settings: SettingsDep,
    batcher: BatcherDep,
    metrics: MetricsDep,
) -> JSONResponse:
    started = time.perf_counter()
    if len(body.queries) > settings.max_queries:
        raise _invalid(
            f"queries has {len(body.queries)} items; at most {settings.max_queries} per request", "queries"
        )
    if body.k > settings.max_k:
        raise _invalid(f"k must be between 1 and {settings.max_k}, got {body.k}", "k")
    resolved = request.app.state.registry.current.resolve(
        state.layout,
        weights=body.weights,
        operating_point=body.operating_point,
        experiment=body.experiment,
        unit_id=body.unit_id,
    )
    queries = prepare_queries(body.queries, state)
    hits = await batcher.submit(state, queries, resolved.block_weights, body.k)
    # Counted once served (not when refused with 429); experiment counts are exposures only.
    _observe_weights(metrics, state.layout, resolved.block_weights, len(queries))
    exposure = resolved.experiment is not None and resolved.arm is not None and not resolved.excluded
    if exposure:
        metrics.experiment_requests.labels(experiment=resolved.experiment, arm=resolved.arm).inc(len(queries))
    if sum(len(h.rows) for h in hits) > _BUILD_INLINE_MAX_HITS:
        results = await asyncio.to_thread(build_results, state, hits)
    else:
        results = build_results(state, hits)
    if exposure:  # latency by arm: the A/B dashboard compares arms on it
        metrics.experiment_request_duration.labels(experiment=resolved.experiment, arm=resolved.arm).observe(
            time.perf_counter() - started
        )
    return JSONResponse(
        {
            "results": results,
            "weights_used": resolved.weights_used,
            "operating_point": resolved.operating_point,
            "experiment": resolved.experiment,
            "arm": resolved.arm,
            "bundle_version": state.version,
            "backend": state.engine.name,
        }
    )
