"""``POST /v1/search``: validate, resolve weights, queue on the micro-batcher, build the hits.

Each request captures the served state once; its vectors are validated against that state's
layout and scored on that state, even if a hot reload swaps the bundle meanwhile. It holds the
state (:meth:`~service.state.ServingState.acquire`) until its answer is built, so a retired
engine is closed only after its last request.

Cost per request is bounded: at most ``max_queries`` queries, ``k <= max_k``, queries x k at most
``max_hits`` and a response body of at most ``max_response_bytes`` (each a 422 naming the limit
and its setting), ``offset + k`` within the same limits (:mod:`service.page`); the response is
measured while it is built, so an oversized one stops early.

The route is an ordinary FastAPI route (dependencies, overrides, the app's middleware and
exception handlers all apply); only JSON goes through pydantic-core's Rust codec, because a
vector query is hundreds of floats: :class:`PydanticJSONRoute` parses and validates the body
with it and, when it validates, calls the endpoint without FastAPI's general dependency
solver, and :class:`PydanticJSONResponse` renders the answer.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np
import pydantic_core
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.telemetry import get_telemetry_data
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.batching import QueryHits, QueryInput
from service.errors import NotReadyError
from service.exposure import log_search_exposure
from service.filtering import filter_context, filtered
from service.metrics import Metrics
from service.page import DISPLAY_FIELDS, SearchPage, search_page
from service.routes.deps import SearchContext, SearchContextDep
from service.schemas import Query, SearchRequest, SearchResponse, error_responses
from service.state import ServingState
from service.tracing import DISABLED, Tracing
from subspace.errors import FieldError
from subspace.layout import SubspaceLayout


def _loads(body: bytes) -> Any:
    """``json.loads`` semantics (it raises ``json.JSONDecodeError``), pydantic-core speed: what
    ``from_json`` refuses (a UTF-16 body, a BOM, a lone surrogate escape) the stdlib judges, so
    what is accepted and every "not valid JSON" message are FastAPI's own."""
    try:
        return pydantic_core.from_json(body)
    except ValueError:
        return json.loads(body)


class _ModelJSONRequest(Request):
    """A request whose ``json()`` is the body model itself when the body validates against it
    (pydantic-core parses, then validates the parsed value as FastAPI does: on a list of
    hundreds of floats this measured faster than ``model_validate_json`` in one call). FastAPI
    accepts an instance of the declared model as is; a body that does not validate stays plain
    JSON, so FastAPI's own validation reports the errors exactly as for any other route."""

    body_model: type[BaseModel]

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            with _tracing(self.scope).span("esp.search.parse", **{"esp.body_bytes": len(raw)}):
                data = _loads(raw)
                try:
                    self._json = self.body_model.model_validate(data)
                except ValidationError:
                    self._json = data
        return self._json


_JSON_TYPES = frozenset({"application/json", "application/json; charset=utf-8"})


@dataclass(frozen=True, slots=True)
class _DirectCall:
    """How to call a route's endpoint without FastAPI's dependency solving: its body parameter
    and its dependencies, each an ``async def`` of the request alone."""

    body_name: str
    dependencies: tuple[tuple[str, Callable[[Request], Awaitable[Any]]], ...]

    @classmethod
    def of(cls, dependant: Dependant) -> _DirectCall | None:
        """The plan for ``dependant``, or None when it needs anything else (query, header or
        cookie parameters, a sub-dependency, a generator, background tasks, security) or does
        not return a :class:`Response` itself (FastAPI would serialise what it returns)."""
        call = dependant.call
        if not _needs_only(dependant, body=True) or not inspect.iscoroutinefunction(call):
            return None
        returns = typing.get_type_hints(call).get("return")
        if not (isinstance(returns, type) and issubclass(returns, Response)):
            return None
        dependencies = []
        for sub in dependant.dependencies:
            plain = _needs_only(sub, body=False) and sub.request_param_name
            if not (plain and inspect.iscoroutinefunction(sub.call)):
                return None
            dependencies.append((sub.name or "", sub.call))
        return cls(dependant.body_params[0].name, tuple(dependencies))

    def applies(self, request: Request) -> bool:
        """Whether this request can take the direct call: JSON, no override of a dependency
        (``app.dependency_overrides``), FastAPI's own telemetry off."""
        if request.headers.get("content-type") not in _JSON_TYPES or get_telemetry_data() is not None:
            return False
        overrides = getattr(request.app, "dependency_overrides", None)
        return not overrides or not any(call in overrides for _, call in self.dependencies)


def _needs_only(dependant: Dependant, *, body: bool) -> bool:
    """``dependant`` takes nothing but one body (``body``) or nothing but dependencies and the request."""
    extra = (
        dependant.path_params, dependant.query_params, dependant.header_params, dependant.cookie_params,
        dependant.websocket_param_name, dependant.http_connection_param_name, dependant.response_param_name,
        dependant.background_tasks_param_name, dependant.security_scopes_param_name,
    )
    if any(extra) or len(dependant.body_params) != int(body) or (not body and dependant.dependencies):
        return False
    return not (body and dependant.request_param_name)


class PydanticJSONRoute(APIRoute):
    """An :class:`APIRoute` whose JSON body is parsed by pydantic-core and validated by its model.

    Middleware, exception handlers, errors and the OpenAPI schema are FastAPI's; the body's
    parsing changes (a vector query is hundreds of floats: the stdlib's ``json.loads`` plus
    validating the dict costs several times one pydantic-core call), and a request whose body
    validates calls the endpoint directly: its dependencies are ``async def`` functions of the
    request, awaited in order, where FastAPI's general solver (content-type parsing, parameter
    models, caches, exit stacks) costs about as much as the rest of a search on the event loop.
    Everything else (a body that does not validate or is not JSON, an overridden dependency,
    FastAPI's telemetry) goes through FastAPI's own handler with the same request, so every
    error is FastAPI's.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = self.body_field.field_info.annotation if self.body_field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return handler
        request_class = type(f"{model.__name__}JSONRequest", (_ModelJSONRequest,), {"body_model": model})
        direct = _DirectCall.of(self.dependant)
        endpoint = self.dependant.call

        async def run(request: Request) -> Response:
            if direct is None or not direct.applies(request):
                return await handler(request)
            try:
                body = await request.json()
            except Exception:  # not JSON, or the body could not be read: FastAPI says which
                return await handler(request)
            if not isinstance(body, model):  # FastAPI's validation reports the errors
                return await handler(request)
            values = {name: await call(request) for name, call in direct.dependencies}
            response: Response = await endpoint(**{direct.body_name: body}, **values)  # type: ignore[misc]
            return response

        async def model_json_handler(request: Request) -> Response:
            json_request = request_class(request.scope, request.receive, request._send)
            tracing = _tracing(request.scope)
            if not tracing.enabled:
                return await run(json_request)
            name = f"esp.{model.__name__.removesuffix('Request').lower()}"
            with tracing.request_span(name, request.headers):
                return await run(json_request)

        return model_json_handler


class PydanticJSONResponse(JSONResponse):
    """A :class:`JSONResponse` rendered by pydantic-core (compact UTF-8, like Starlette's).

    Content must be JSON types; non-finite floats are written as ``null`` where the stdlib
    would raise, so callers send finite numbers only (engine scores are).
    """

    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content)


def _tracing(scope: Any) -> Tracing:
    app = scope.get("app")
    tracing: Tracing = getattr(app.state, "tracing", DISABLED) if app is not None else DISABLED
    return tracing


#: Responses with more hits than this are built on a worker thread, off the event loop.
_BUILD_INLINE_MAX_HITS = 4096


def _layout_desc(layout: SubspaceLayout) -> str:
    return ", ".join(f"{n}:{d}" for n, d in zip(layout.names, layout.dims, strict=True))


def query_vector(
    vector: list[float] | dict[str, list[float]], layout: SubspaceLayout, field: str
) -> np.ndarray:
    """A request vector (full or per subspace) -> ``(D,)`` float64 as sent, checked against the
    layout and not all zero; the micro-batch normalises each block (``subspace.scoring.normalize_blocks``)."""
    if isinstance(vector, dict):
        out = np.zeros(layout.dim, dtype=np.float64)
        for name, block in vector.items():
            if name not in layout:
                raise FieldError(
                    f"{field} has unknown subspace {name!r}; valid names: {list(layout.names)}",
                    f"{field}.{name}",
                )
            if len(block) != layout[name].dim:
                raise FieldError(
                    f"{field}.{name} has {len(block)} components; subspace {name!r} has dim "
                    f"{layout[name].dim}",
                    f"{field}.{name}",
                )
            out[layout.slice(name)] = block
    else:
        if len(vector) != layout.dim:
            raise FieldError(
                f"{field} has {len(vector)} components; the layout has D={layout.dim} "
                f"({_layout_desc(layout)}), or send an object by subspace name",
                field,
            )
        out = np.asarray(vector, dtype=np.float64)
    # A finite non-zero block normalises to a non-zero block: checking the raw values suffices.
    if not out.any():
        raise FieldError(f"{field} is all zero: at least one subspace block must be non-zero", field)
    return out


def prepare_queries(queries: list[Query], state: ServingState) -> list[QueryInput]:
    out = []
    for i, q in enumerate(queries):
        field = f"queries[{i}]"
        if q.text is not None:
            if state.encoder is None:
                raise FieldError(
                    f"bundle {state.version} has no query encoder: send vectors instead of text",
                    f"{field}.text",
                )
            out.append(QueryInput(text=q.text))
        else:
            assert q.vector is not None  # the schema guarantees exactly one
            out.append(QueryInput(vector=query_vector(q.vector, state.layout, f"{field}.vector")))
    return out


_HIT_OVERHEAD = 48  # bytes of a hit's JSON besides its id, display fields and subspace scores
_SUBSPACE_BYTES = 32  # one "name": score pair, about


def _too_large(size: int, limit: int) -> FieldError:
    return FieldError(
        f"the response would be larger than {limit} bytes (setting ESP_MAX_RESPONSE_BYTES; about {size} "
        "so far): ask for a smaller k or fewer queries",
        "k",
    )


def build_results(
    state: ServingState, hits: list[QueryHits], max_bytes: int | None = None, page: SearchPage | None = None
) -> list[dict[str, Any]]:
    """The ``results`` of a response. With ``max_bytes``, the body's size is estimated as it is
    built and a :class:`FieldError` raised as soon as it exceeds the limit. ``page``: which of
    each query's ranked hits are returned and what fields they carry (:mod:`service.page`)."""
    names = state.layout.names
    ids, docs = state.bundle.ids, state.docs
    per_hit = _HIT_OVERHEAD + _SUBSPACE_BYTES * len(names)
    size = 0
    results = []
    for h in hits:
        out = []
        rows, scores, subs = h.rows.tolist(), h.scores.tolist(), h.subspace_scores.tolist()
        if page is not None:
            shown = page.cut(rows, scores)
            rows, scores, subs = rows[shown], scores[shown], subs[shown]
        # a backend that stores documents itself (milvus) names its hits; rows -1 pad short lists
        found = [r for r in rows if r >= 0]
        live = state.engine.documents(found) if state.engine.capabilities.metadata and found else None
        for j, (row, score, sub) in enumerate(zip(rows, scores, subs, strict=True)):
            if row < 0:
                break
            hit: dict[str, Any] = {
                "id": ids[row] if live is None else live[j][0],
                "score": score,
                "subspace_scores": dict(zip(names, sub, strict=True)),
            }
            size += per_hit + len(hit["id"])
            doc = live[j][1] if live is not None else docs[row] if docs is not None else None
            if page is not None and page.fields is not None:
                hit["fields"] = selected = page.hit_fields(doc)
                size += sum(len(name) + len(str(value)) + 8 for name, value in selected.items())
            elif doc is not None:
                for key in DISPLAY_FIELDS:
                    value = doc.get(key)
                    if isinstance(value, str):
                        hit[key] = value
                        size += len(value) + 12
            if max_bytes is not None and size > max_bytes:
                raise _too_large(size, max_bytes)
            out.append(hit)
        results.append({"hits": out})
    return results


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
        raise _too_large(len(response.body), limit)
    return response


def add_search_route(app: FastAPI) -> None:
    """Declare ``POST /v1/search`` on the app's own router, ahead of every other route.

    The hottest route is matched first and directly: FastAPI matches an included router by
    walking its routes, once to match and again to handle, on every request.
    """
    app.router.add_api_route(
        "/v1/search",
        search,
        methods=["POST"],
        response_model=SearchResponse,
        responses=error_responses(413, 422, 429, 503),
        summary="Exact weighted top-k over all subspaces, weights chosen per request",
        tags=["search"],
        route_class_override=PydanticJSONRoute,
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
        state.layout,
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
    queries = prepare_queries(body.queries, state)
    if body.filter is not None:  # scored in its own engine call, over the rows the filter allows
        state = filtered(state, filter_context(state).compile(body.filter))
    stages = ctx.tracing.stages()  # None unless traced: then the batch's stage times land here
    hits = await ctx.batcher.submit(
        state, queries, resolved.block_weights, page.engine_k, ctx.receive, stages=stages
    )
    ctx.tracing.record_stages(stages)
    # Counted once served (not when refused with 429); experiment counts are exposures only.
    _observe_weights(metrics, state.layout, resolved.block_weights, len(queries))
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
    if exposure and ctx.exposure is not None:  # one record per exposure (service.exposure)
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
