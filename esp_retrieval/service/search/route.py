"""``POST /v1/search``: validate, resolve weights, queue on the micro-batcher, build the hits.

Each request captures the served state once; its vectors are validated against that state's
layout and scored on that state, even if a hot reload swaps the bundle meanwhile. It holds the
state (:meth:`~esp_retrieval.service.state.ServingState.acquire`) until its answer is built, so a retired
engine is closed only after its last request.

Cost per request is bounded: at most ``max_queries`` queries, ``k <= max_k``, queries x k at most
``max_hits`` and a response body of at most ``max_response_bytes`` (each a 422 naming the limit
and its setting), ``offset + k`` within the same limits (:mod:`service.search.page`); a request whose
smallest possible answer is past ``max_response_bytes`` is refused before the engine runs, and the
response is measured while it is built, so an oversized one stops early
(:mod:`esp_retrieval.service.search.results`).

The route is an ordinary FastAPI route (dependencies, overrides, the app's middleware and
exception handlers all apply); only JSON goes through pydantic-core's Rust codec, because a
vector query is hundreds of floats: :class:`PydanticJSONRoute` parses and validates the body
with it and, when it validates, calls the endpoint without FastAPI's general dependency
solver, and :class:`PydanticJSONResponse` renders the answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from fastapi import FastAPI

from esp_retrieval.service import sparse_query
from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.service.exposure import log_search_exposure
from esp_retrieval.service.filtering import filter_context, filtered
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.schemas import SearchRequest, SearchResponse, error_responses
from esp_retrieval.service.search.codec import PydanticJSONResponse, PydanticJSONRoute
from esp_retrieval.service.search.page import search_page
from esp_retrieval.service.search.pipeline import SearchContext, SearchContextDep, SearchPipeline
from esp_retrieval.service.search.results import build_results, check_answer_size, prepare_queries, too_large
from esp_retrieval.service.tracing import Tracing
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout

#: Responses with more hits than this are built on a worker thread, off the event loop.
_BUILD_INLINE_MAX_HITS = 4096


def _observe_weights(metrics: Metrics, layout: SubspaceLayout, block_weights: np.ndarray, n: int) -> None:
    for name, w in zip(layout.names, block_weights.tolist(), strict=True):
        hist = metrics.child(metrics.weights_requested, name)
        for _ in range(n):
            hist.observe(w)


async def search(body: SearchRequest, ctx: SearchContextDep) -> PydanticJSONResponse:
    content = await run_search(body, ctx)
    with ctx.tracing.span("esp.search.serialise"):
        response = PydanticJSONResponse(content)
    limit = ctx.settings.max_response_bytes
    if len(response.body) > limit:
        raise too_large(len(response.body), limit)
    return response


def add_search_route(app: FastAPI, pipeline: SearchPipeline) -> None:
    """Declare ``POST /v1/search`` on the app's own router, ahead of every other route.

    The hottest route is matched first and directly: FastAPI matches an included router by
    walking its routes, once to match and again to handle, on every request. Its body is
    parsed under the pipeline's tracing (:class:`esp_retrieval.service.search.codec.PydanticJSONRoute`).
    """

    class SearchRoute(PydanticJSONRoute):
        @staticmethod
        def tracing() -> Tracing:
            return pipeline.tracing

    app.router.add_api_route(
        "/v1/search",
        search,
        methods=["POST"],
        response_model=SearchResponse,
        responses=error_responses(413, 422, 429, 503),
        summary="Exact weighted top-k over all subspaces, weights chosen per request",
        tags=["search"],
        route_class_override=SearchRoute,
    )
    routes = app.router.routes
    routes.insert(0, routes.pop())


async def run_search(body: SearchRequest, ctx: SearchContext) -> dict[str, Any]:
    """The search itself, after body validation: the response body as JSON types.

    Raises domain errors (``FieldError`` 422, ``OverloadedError`` 429, ``NotReadyError`` 503).
    """
    started = time.perf_counter()
    state, settings = ctx.state, ctx.settings
    if len(body.queries) > settings.max_queries:
        raise FieldError(
            f"queries has {len(body.queries)} items; at most {settings.max_queries} per request", "queries"
        )
    if body.k > settings.max_k:
        raise FieldError(f"k must be between 1 and {settings.max_k}, got {body.k}", "k")
    if len(body.queries) * body.k > settings.max_hits:
        raise FieldError(
            f"{len(body.queries)} queries x k={body.k} asks for {len(body.queries) * body.k} hits; at most "
            f"{settings.max_hits} per request (setting ESP_MAX_HITS): send fewer queries or a smaller k",
            "k",
        )
    if not state.acquire():  # retired and closed between capture and here: the caller retries
        raise NotReadyError("the served bundle was just replaced; retry", retry_after=1.0)
    try:
        return await _run_search(body, ctx, started)
    finally:
        state.release()


async def _run_search(body: SearchRequest, ctx: SearchContext, started: float) -> dict[str, Any]:
    state, metrics = ctx.state, ctx.metrics
    max_bytes = ctx.settings.max_response_bytes
    resolved = ctx.registry.current.resolve(
        state.weight_layout,  # the layout's names and the bundle's sparse blocks' (service.sparse_query)
        weights=body.weights,
        operating_point=body.operating_point,
        experiment=body.experiment,
        unit_id=body.unit_id,
    )
    page = search_page(
        ctx.settings,
        filter_context(state).schema if body.fields is not None else None,
        n_queries=len(body.queries),
        k=body.k,
        offset=body.offset,
        score_threshold=body.score_threshold,
        fields=body.fields,
    )
    check_answer_size(state, len(body.queries), page, max_bytes, filtered=body.filter is not None)
    queries = prepare_queries(body.queries, state)
    dense_weights, sparse_weights = sparse_query.for_request(body, resolved, state)
    if body.filter is not None:  # scored in its own engine call, over the rows the filter allows
        state = filtered(state, filter_context(state).compile(body.filter))
    stages = ctx.tracing.stages()  # None unless traced: then the batch's stage times land here
    hits = await ctx.batcher.submit(
        state, queries, dense_weights, page.engine_k, ctx.receive, stages=stages, arrival=ctx.arrival,
        sparse_weights=sparse_weights,
    )
    ctx.tracing.record_stages(stages)
    # Counted once served (not when refused with 429); experiment counts are exposures only.
    _observe_weights(metrics, state.weight_layout, resolved.block_weights, len(queries))
    exposure = resolved.experiment is not None and resolved.arm is not None and not resolved.excluded
    if exposure:
        metrics.experiment_requests.labels(experiment=resolved.experiment, arm=resolved.arm).inc(len(queries))
    if sum(len(h.rows) for h in hits) > _BUILD_INLINE_MAX_HITS:
        results = await asyncio.to_thread(build_results, state, hits, max_bytes, page)
    else:
        results = build_results(state, hits, max_bytes, page)
    if exposure:  # latency by arm: the A/B dashboard compares arms on it
        metrics.experiment_request_duration.labels(experiment=resolved.experiment, arm=resolved.arm).observe(
            time.perf_counter() - started
        )
    if exposure and ctx.exposure is not None:  # one record per exposure (esp_retrieval.service.exposure)
        log_search_exposure(ctx.exposure, resolved=resolved, unit_id=body.unit_id,
                            bundle_version=state.version, k=body.k, results=results,
                            latency_seconds=time.perf_counter() - started)
    return {
        "results": results,
        "weights_used": resolved.weights_used,
        "operating_point": resolved.operating_point,
        "experiment": resolved.experiment,
        "arm": resolved.arm,
        "in_experiment": None if resolved.experiment is None else not resolved.excluded,
        "bundle_version": state.version,
        "backend": state.engine.name,
    }
