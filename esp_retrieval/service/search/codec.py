"""The search wing's JSON codec: pydantic-core parses and validates the body and renders the
answer, and a body that validates calls the endpoint without FastAPI's general dependency solver.

A vector query is hundreds of floats: the stdlib's ``json.loads`` plus validating the dict costs
several times one pydantic-core call, and FastAPI's solver (content-type parsing, parameter
models, caches, exit stacks) costs about as much as the rest of a search on the event loop.
Everything else (a body that does not validate or is not JSON, an overridden dependency,
FastAPI's telemetry) goes through FastAPI's own handler with the same request, so every error is
FastAPI's. The FastAPI internals read here (``Dependant``'s fields, ``Request._send``,
``fastapi.telemetry``) are pinned in pyproject.toml and checked by
``tests/service/search/test_framework_contract.py``.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.telemetry import get_telemetry_data
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from esp_retrieval.service.tracing import DISABLED, Tracing


def _loads(body: bytes) -> Any:
    """``json.loads`` semantics (it raises ``json.JSONDecodeError``), pydantic-core speed: what
    ``from_json`` refuses (a UTF-16 body, a BOM, a lone surrogate escape) the stdlib judges, so
    what is accepted and every "not valid JSON" message are FastAPI's own."""
    try:
        return pydantic_core.from_json(body)
    except ValueError:
        return json.loads(body)


_UNPARSED = object()


class _ModelJSONRequest(Request):
    """A request whose ``json()`` is the body model itself when the body validates against it
    (pydantic-core parses, then validates the parsed value as FastAPI does: on a list of
    hundreds of floats this measured faster than ``model_validate_json`` in one call). FastAPI
    accepts an instance of the declared model as is; a body that does not validate stays plain
    JSON, so FastAPI's own validation reports the errors exactly as for any other route."""

    body_model: type[BaseModel]
    _parsed: Any = None  # the parsed body, once read (_UNPARSED until then)

    def __init__(self, scope: Any, receive: Any, send: Any, tracing: Tracing) -> None:
        super().__init__(scope, receive, send)
        self.tracing = tracing
        self._parsed = _UNPARSED

    async def json(self) -> Any:
        if self._parsed is _UNPARSED:
            raw = await self.body()
            with self.tracing.span("esp.search.parse", **{"esp.body_bytes": len(raw)}):
                data = _loads(raw)
                try:
                    self._parsed = self.body_model.model_validate(data)
                except ValidationError:
                    self._parsed = data
        return self._parsed


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
        overrides = request.app.dependency_overrides
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

    @staticmethod
    def tracing() -> Tracing:
        """The spans of the requests it parses (a route of the app overrides it with the app's)."""
        return DISABLED

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
            tracing = self.tracing()
            json_request = request_class(request.scope, request.receive, request._send, tracing)
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
