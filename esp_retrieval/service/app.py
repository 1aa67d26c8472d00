"""The FastAPI application: :func:`create_app` builds it, the lifespan loads the bundle.

Start-up (lifespan): the loop's pool for blocking work (:mod:`esp_retrieval.service.blocking`), the registry
watcher, the micro-batcher and its worker thread start, and the bundle named by settings is
loaded *in the background* (read, checksums, engine, encoder, warm-up search), so ``/healthz``
answers at once and ``/readyz`` turns 200 only when the bundle is servable. Every error, the
framework's own included, leaves as one body ``{"type", "message", "field"}``: domain errors
with the status of their class in :data:`esp_retrieval.service.errors.ERROR_KINDS`, one handler registered
per class of that table.

Run it with ``esp serve --bundle DIR`` or ``uvicorn --factory esp_retrieval.service.app:create_app``
(settings from ``ESP_*`` environment variables, :mod:`esp_retrieval.service.config`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from esp_retrieval.service import blocking
from esp_retrieval.service.config import Settings, get_settings
from esp_retrieval.service.encoder_queue import EncoderQueue
from esp_retrieval.service.errors import (
    ERROR_KINDS,
    ErrorKind,
    ReloadRefusedError,
    error_body,
    error_parts,
    is_openai_path,
    kind_for_status,
    openai_error_body,
)
from esp_retrieval.service.exposure import ExposureLog
from esp_retrieval.service.http_limits import HEAD_ADMISSION
from esp_retrieval.service.lifecycle import load_and_activate
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.middleware import BodyLimitMiddleware, MetricsMiddleware, RequestIdMiddleware
from esp_retrieval.service.rollout import RolloutReconciler
from esp_retrieval.service.routes import admin, cluster, docs, documents, embeddings, meta, tuning, ui
from esp_retrieval.service.schemas import UNION_TAGS, error_responses
from esp_retrieval.service.search import route as search
from esp_retrieval.service.search.admission import AdmissionMiddleware, HeadAdmission
from esp_retrieval.service.search.batching import MicroBatcher
from esp_retrieval.service.search.pipeline import SearchPipeline
from esp_retrieval.service.state import StateHolder
from esp_retrieval.service.tracing import Tracing
from esp_retrieval.service.tuning import RegistryWatcher

log = logging.getLogger(__name__)

_LOC_ROOTS = ("body", "query", "path", "header", "cookie")


def dotted_field(loc: Sequence[Any]) -> str | None:
    """pydantic's ``('body', 'queries', 0, 'vector', 'Full', 3)`` -> ``queries[0].vector[3]``."""
    parts = list(loc)
    if parts and parts[0] in _LOC_ROOTS:
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in UNION_TAGS:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _describe(err: dict[str, Any]) -> tuple[str | None, str]:
    field = dotted_field(err.get("loc", ()))
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid"))
    if kind == "json_invalid":
        return None, f"request body is not valid JSON ({err.get('ctx', {}).get('error', msg)})"
    if kind == "missing":
        return field, f"{field} is required" if field else "a JSON request body is required"
    if kind == "extra_forbidden":
        return field, f"{field} is not an accepted field"
    msg = msg.removeprefix("Value error, ")
    return field, f"{field}: {msg}" if field else msg


def validation_error_body(errors: Sequence[Any]) -> dict[str, Any]:
    """One error body for pydantic's error list: the first error's field, all messages (max 3)."""
    described = [_describe(dict(e)) for e in errors] or [(None, "invalid request")]
    field, message = described[0]
    if len(described) > 1:
        more = "; ".join(m for _, m in described[1:3])
        extra = f" (+{len(described) - 3} more)" if len(described) > 3 else ""
        message = f"{message}; also: {more}{extra}"
    return error_body(ErrorKind.VALIDATION, message, field)


def body_parse_message(cause: BaseException) -> str:
    """Why a request body could not be parsed (invalid UTF-8, a number of 4,300+ digits, ...),
    in one line naming the body."""
    reason = str(cause).split("\n", 1)[0][:300]
    if isinstance(cause, UnicodeDecodeError):
        reason = f"not valid UTF-8 at byte {cause.start}"
    return f"request body could not be parsed as JSON: {reason}"


_JSON_TYPES = ("application/json",)


def content_type_problem(request: Request, errors: Sequence[Any]) -> str | None:
    """The message for a body that was not taken as JSON because of its Content-Type (none, or
    not JSON): FastAPI then validates the raw bytes and says "a valid dictionary" instead."""
    body_errors = [e for e in errors if tuple(e.get("loc", ())) == ("body",)]
    if not body_errors or body_errors[0].get("type") not in ("model_attributes_type", "dict_type"):
        return None
    sent = request.headers.get("content-type", "")
    media = sent.split(";", 1)[0].strip().lower()
    if media in _JSON_TYPES or media.endswith("+json"):
        return None
    got = f"Content-Type {sent!r}" if sent else "no Content-Type"
    return f"the request body must be JSON sent with Content-Type: application/json (got {got})"


def _answer(
    request: Request, body: dict[str, Any], status: int, headers: dict[str, str] | None = None,
    code: str | None = None,
) -> JSONResponse:
    """An error response: this service's body, or OpenAI's shape on the OpenAI-compatible routes
    (``code``: the specific reason OpenAI's body carries, when there is one)."""
    if is_openai_path(request.url.path):
        body = openai_error_body(body, status, code)
    return JSONResponse(body, status_code=status, headers=headers or None)


def _install_error_handlers(app: FastAPI) -> None:
    async def domain_error(request: Request, exc: Exception) -> JSONResponse:
        body, status, headers = error_parts(exc)
        return _answer(request, body, status, headers, getattr(exc, "code", None))

    async def request_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        not_json = content_type_problem(request, errors)
        if not_json is not None:
            return _answer(request, error_body(ErrorKind.VALIDATION, not_json, "body"), 422)
        code = (errors[0].get("ctx") or {}).get("openai_code") if errors else None
        return _answer(request, validation_error_body(errors), 422, code=code)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = kind_for_status(exc.status_code)
        detail = exc.detail if isinstance(exc.detail, str) else kind.value
        field = None
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body
            detail, field = body_parse_message(exc.__cause__), "body"
        return _answer(request, error_body(kind, detail, field), exc.status_code, dict(exc.headers or {}))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error: %s", exc, exc_info=exc)
        return _answer(request, error_body(ErrorKind.INTERNAL, "internal error (logged)"), 500)

    for cls in ERROR_KINDS:
        app.add_exception_handler(cls, domain_error)
    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


async def _initial_load(app: FastAPI, settings: Settings) -> None:
    assert settings.bundle_source is not None
    with contextlib.suppress(ReloadRefusedError):  # logged, counted; /readyz reports the reason
        await load_and_activate(app.state, settings.bundle_source, settings, sha256=settings.bundle_sha256,
                                check_registry=False, field="ESP_BUNDLE")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, object]]:
    settings: Settings = app.state.settings
    metrics: Metrics = app.state.metrics
    metrics.ready.set(0)
    pool = await blocking.install(settings.blocking_threads)
    pipeline: SearchPipeline = app.state.search
    app.state.registry = pipeline.registry = RegistryWatcher(
        settings.registry, metrics, settings.registry_poll_seconds
    )
    exposure = pipeline.exposure = ExposureLog.from_settings(settings)
    batcher = MicroBatcher(
        metrics,
        max_batch=settings.max_batch,
        max_wait_ms=settings.max_wait_ms,
        queue_size=settings.queue_size,
        gather=settings.batching,
        latency_budget_ms=settings.latency_budget_ms,
    )
    await batcher.start()
    pipeline.batcher = batcher
    await app.state.registry.start()
    app.state.rollout = RolloutReconciler(app.state, settings)  # the bundle the registry file names
    await app.state.rollout.start()
    loader: asyncio.Task[None] | None = None
    if settings.bundle_source is not None:
        loader = asyncio.create_task(_initial_load(app, settings), name="esp-initial-load")
    else:
        app.state.holder.error = "no bundle configured (ESP_BUNDLE); load one with POST /v1/admin/reload"
        log.warning("no bundle configured: not ready until one is loaded through /v1/admin/reload")
    try:
        # uvicorn hands this state to the HTTP protocol: searches refused at their headers
        yield {HEAD_ADMISSION: HeadAdmission(pipeline)}
    finally:
        metrics.ready.set(0)
        if loader is not None and not loader.done():
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
        pipeline.batcher = None
        await batcher.stop()
        await app.state.rollout.stop()
        await app.state.registry.stop()
        pipeline.exposure = None
        exposure.close()
        pipeline.tracing.flush()
        served = app.state.holder.current
        if served is not None:
            served.retire()  # its engine's threads stop with the app
        blocking.uninstall(pool)


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new app with its own metrics registry; ``settings`` default to :func:`get_settings`."""
    settings = settings if settings is not None else get_settings()
    if settings.max_queries > settings.queue_size:
        raise ValueError(
            f"max_queries ({settings.max_queries}) must not exceed queue_size ({settings.queue_size}): "
            "a full request could never be queued"
        )
    app = FastAPI(
        title="ESP retrieval",
        version="0.1.0",
        summary="Exact multi-subspace kNN with per-request weights (Embedding Subspace Partitioning).",
        docs_url=None,  # /docs and /redoc come from esp_retrieval.service.routes.docs: assets served, no CDN
        redoc_url=None,
        lifespan=lifespan,
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.holder = StateHolder()
    # set at start-up (lifespan); None until then, so routes read them without probing
    app.state.registry = app.state.rollout = None
    app.state.cluster_jobs = 0  # clustering requests running now (esp_retrieval.service.routes.cluster)
    # POST /v1/embeddings requests on the encoder thread, bounded in number and time
    app.state.embedding_queue = EncoderQueue(
        settings.max_embedding_queue, settings.embedding_deadline_seconds,
        "ESP_MAX_EMBEDDING_QUEUE", "ESP_EMBEDDING_DEADLINE_SECONDS",
    )
    # the search wing (service.search): spans of each search (esp_retrieval.service.tracing); the batcher,
    # registry watcher and exposure log join at start-up (lifespan)
    pipeline = app.state.search = SearchPipeline(
        settings, app.state.metrics, app.state.holder, Tracing.from_settings(settings)
    )
    _install_error_handlers(app)
    # innermost: a late search is refused before its body is read
    app.add_middleware(AdmissionMiddleware, pipeline=pipeline)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(RequestIdMiddleware)  # outermost: every line of a request carries its id
    search.add_search_route(app, pipeline)
    app.include_router(meta.router)
    app.include_router(tuning.router, responses=error_responses(404, 422, 503))
    app.include_router(admin.router)
    app.include_router(documents.router)
    app.include_router(cluster.router)
    app.include_router(embeddings.router)
    app.include_router(docs.router)
    app.include_router(ui.router)
    return app
