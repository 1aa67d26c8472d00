"""A pure-ASGI fast path for well-formed ``POST /v1/search`` requests, ahead of FastAPI.

Why: FastAPI's routing, dependency solving, exception layers and the middleware stack cost
more event-loop CPU per request than the route's own work (measured on the 2-core machine
under a cheap load client: ~1.3 ms of event-loop CPU per search request through FastAPI; a
no-op FastAPI POST endpoint ~0.35 ms, a bare ASGI app ~0.09 ms), and on two cores that CPU is
taken from the engine, which is what micro-batching is there to feed. Ahead of the middleware
stack rather than inside it, the server's event-loop thread spent ~0.50 ms per search
(uvicorn included) at concurrency 32 instead of ~0.65 (together with the cached layout
tuples and registry weights and batch-side vector normalisation; 2-core machine, shared).

What: :class:`~service.app.ESPApp` offers every request to :meth:`SearchFastPath.takes` first.
It takes a POST to exactly ``/v1/search`` with an ``application/json`` body whose
``Content-Length`` is within ``max_body_bytes``, while no ``dependency_overrides`` are set (a
test that overrides a dependency must get the declared route, which honours them). It parses
the body with pydantic-core and validates it against :class:`~service.schemas.SearchRequest`;
when that succeeds and a bundle is served, it runs the route's own
:func:`~service.routes.search.run_search`, answers, and counts the request in
``esp_requests_total`` / ``esp_request_duration_seconds`` through the metrics middleware's own
:func:`~service.middleware.counted`. A domain error is answered as the app's handler
answers it; any other exception as the app's ``Exception`` handler answers it (then re-raised
for the server to log, as Starlette's error middleware does). Everything else (a malformed or
invalid body, another content type, method or path, a chunked or oversized body, no bundle
yet) goes to the whole FastAPI app with the body replayed unchanged, so those statuses and
messages, the middleware, and the OpenAPI schema come from the one declared route exactly as
before.
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any

import pydantic_core
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_response
from service.middleware import counted
from service.routes.deps import SearchContext
from service.routes.search import run_search
from service.schemas import SearchRequest
from service.state import ServingState, StateHolder
from subspace.errors import FieldError

SEARCH_PATH = "/v1/search"


def _parse(body: bytes) -> SearchRequest | None:
    """The validated body, or None when FastAPI's own parsing should answer (with its error)."""
    if not body:
        return None
    try:
        return SearchRequest.model_validate(pydantic_core.from_json(body))
    except (ValueError, ValidationError):  # pydantic-core's JSON error is a ValueError
        return None


class SearchFastPath:
    """Answers valid searches for ``app``; hands everything else to ``full`` (the whole app)."""

    def __init__(self, app: FastAPI, full: ASGIApp) -> None:
        self.app = app
        self.full = full

    def takes(self, scope: Scope) -> bool:
        """Whether this request is a candidate: JSON POST to the search path, a declared length
        within the body limit, and no dependency overrides. Cheap: headers only."""
        if scope["type"] != "http" or scope["path"] != SEARCH_PATH or scope["method"] != "POST":
            return False
        if self.app.dependency_overrides:
            return False
        json_body = False
        length = b""
        for name, value in scope.get("headers") or ():
            if name == b"content-type":
                json_body = value.split(b";", 1)[0].strip().lower() == b"application/json"
            elif name == b"content-length":
                length = value
        # No or a malformed Content-Length (a chunked upload): the body-limit middleware counts it.
        if not json_body or not length.isdigit():
            return False
        return int(length) <= self.app.state.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        messages: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: let the app see it
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        app_state = self.app.state
        holder: StateHolder = app_state.holder
        body = _parse(b"".join(chunks)) if messages[-1]["type"] == "http.request" else None
        state = holder.current
        if body is None or state is None:

            async def replay() -> Message:
                return messages.pop(0) if messages else await receive()

            await self.full(scope, replay, send)
            return
        answer = functools.partial(self._answer, body, state)
        metrics = app_state.metrics
        await counted(answer, scope, receive, send, metrics=metrics, route=_search_route, started=started)

    async def _answer(
        self, body: SearchRequest, state: ServingState, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run the route's search and answer. Everything that can fail runs before the first
        byte is sent, so an unexpected error still gets the app's ``Exception`` handler's answer
        (then is re-raised for the server to log, as Starlette's error middleware does)."""
        s = self.app.state
        ctx = SearchContext(state, s.settings, s.batcher, s.metrics, s.registry)
        try:
            response: ASGIApp = _JSONAnswer(await run_search(body, ctx))
        except FieldError as exc:  # as the app's domain-error handler answers it
            response = error_response(exc)
        except Exception as exc:
            handler = self.app.exception_handlers.get(Exception)
            if handler is not None:
                answer = handler(Request(scope, receive), exc)
                if inspect.isawaitable(answer):
                    answer = await answer
                await answer(scope, receive, send)
            raise
        await response(scope, receive, send)


def _search_route(scope: Scope) -> str:
    return SEARCH_PATH


class _JSONAnswer:
    """A 200 JSON answer serialised by pydantic-core up front (so a serialisation error is raised
    before anything is sent)."""

    def __init__(self, content: Any) -> None:
        self.payload = pydantic_core.to_json(content)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = str(len(self.payload)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.payload})
