"""``POST /v1/cluster``: cluster up to ``max_cluster_keywords`` keywords on the weighted similarity.

The same weights as search (explicit ``weights`` or a registry ``operating_point``), the same
validation and error body. Keywords are de-duplicated case- and space-insensitively (the first
spelling is kept; ``duplicates`` says which positions were merged into which), so every
distinct keyword appears exactly once in ``keywords``. Encoding and clustering run on a worker
thread; at most ``max_cluster_jobs`` run at once, more are answered 429.

Cost is bounded: at most ``max_cluster_keywords`` keywords and ``max_cluster_tokens``
whitespace-separated words over all of them (422 naming ``keywords``), and a request still
running after ``cluster_timeout_seconds`` is answered 503 with ``Retry-After``; its thread stops
at the next encoder batch and still counts against ``max_cluster_jobs`` until it has.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from esp_retrieval.service import sparse_query
from esp_retrieval.service.errors import NotReadyError, OverloadedError
from esp_retrieval.service.routes.deps import SettingsDep, StateDep
from esp_retrieval.service.schemas import ClusterRequest, ClusterResponse, error_responses
from esp_retrieval.subspace.clustering import cluster_keywords, dedupe_keywords, make_method
from esp_retrieval.subspace.errors import FieldError

router = APIRouter(tags=["cluster"])

def _params(body: ClusterRequest) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if body.threshold is not None:
        params["threshold"] = body.threshold
    if body.min_cluster_size is not None:
        params["min_cluster_size"] = body.min_cluster_size
    make_method(body.method, **params)  # validate before any work (ClusteringError: 422)
    return params


@router.post(
    "/v1/cluster",
    response_model=ClusterResponse,
    responses=error_responses(413, 422, 429, 503),
    summary="Cluster keywords on the weighted subspace similarity, weights chosen per request",
)
async def cluster(
    body: ClusterRequest, request: Request, state: StateDep, settings: SettingsDep
) -> JSONResponse:
    limit = settings.max_cluster_keywords
    if len(body.keywords) > limit:
        raise FieldError(f"keywords has {len(body.keywords)} items; at most {limit} per request", "keywords")
    tokens = sum(len(k.split()) for k in body.keywords)
    if tokens > settings.max_cluster_tokens:
        raise FieldError(
            f"keywords have {tokens} words in all; at most {settings.max_cluster_tokens} per request "
            "(setting ESP_MAX_CLUSTER_TOKENS)",
            "keywords",
        )
    keywords, merged = dedupe_keywords(body.keywords)
    resolved = sparse_query.dense_only(request.app.state.registry.current.resolve(
        state.weight_layout, weights=body.weights, operating_point=body.operating_point
    ), state.layout)
    params = _params(body)
    if state.encoder is None:
        raise FieldError(f"bundle {state.version} has no query encoder: it cannot embed keywords", "keywords")
    app_state = request.app.state
    running: int = app_state.cluster_jobs
    if running >= settings.max_cluster_jobs:
        raise OverloadedError(
            f"{running} clustering request(s) already running (max_cluster_jobs); retry shortly",
            retry_after=1.0,
        )
    timeout = settings.cluster_timeout_seconds
    stop = threading.Event()
    deadline = time.monotonic() + timeout

    def progress(_done: int) -> None:  # called by the worker thread after each encoder batch
        if stop.is_set() or time.monotonic() > deadline:
            raise TimeoutError("clustering deadline passed")

    work = functools.partial(
        cluster_keywords,
        state.encoder,
        keywords,
        state.layout,
        resolved.block_weights,
        body.method,
        progress=progress,
        **params,
    )
    app_state.cluster_jobs = running + 1  # the event loop is single-threaded: no lock needed
    job = asyncio.get_running_loop().run_in_executor(None, work)

    def finished(f: asyncio.Future[Any]) -> None:  # the thread is done: the slot is free again
        app_state.cluster_jobs -= 1
        if not f.cancelled():
            f.exception()  # retrieved: an abandoned job's error is not an unhandled one

    job.add_done_callback(finished)
    try:
        result = await asyncio.wait_for(asyncio.shield(job), timeout)
    except TimeoutError:
        stop.set()
        raise NotReadyError(
            f"clustering {len(keywords)} keywords took longer than {timeout:g} s "
            "(setting ESP_CLUSTER_TIMEOUT_SECONDS): send fewer keywords, or retry later",
            "keywords",
            retry_after=timeout,
        ) from None
    return JSONResponse(
        {
            "keywords": result.rows(),
            "clusters": result.summary(),
            "noise": result.result.n_noise,
            "duplicates": [{"index": p, "duplicate_of": q} for p, q in merged],
            "weights_used": resolved.weights_used,
            "operating_point": resolved.operating_point,
            "method": result.result.method,
            "params": result.result.params,
            "bundle_version": state.version,
        }
    )
