"""Pure-ASGI middleware: request metrics by route template, the request body size limit, and
the request id (:class:`RequestIdMiddleware`, outermost: every log line of a request carries it).

Pure ASGI (not ``BaseHTTPMiddleware``) so streaming and the event loop stay untouched and the
route template is read from the scope the router filled in.
"""

from __future__ import annotations

import re
import time
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from esp_retrieval.service.errors import ErrorKind, send_error
from esp_retrieval.service.logs import REQUEST_ID, request_id_from
from esp_retrieval.service.metrics import Metrics

UNMATCHED = "unmatched"


def _templates(app: Any) -> list[tuple[re.Pattern[str], str]]:
    """The app's route paths with their compiled patterns, read from its routes once (not from
    ``app.openapi()``: generating the document costs about half a second of the event loop, paid
    by the first request answered before routing)."""
    cached = getattr(app.state, "_route_templates", None)
    if cached is None:
        paths = [r.path for r in iter_route_contexts(app.routes) if isinstance(r.path, str)]
        cached = [(compile_path(p)[0], p) for p in paths]
        app.state._route_templates = cached
    return cached


def route_template(scope: Scope) -> str:
    """The matched route's path template (bounded label values); ``unmatched`` otherwise.

    Requests answered before routing (413, an early 429) are matched against the app's routes.
    """
    route = scope.get("route")
    if route is not None and hasattr(route, "path"):
        return str(route.path)
    app = scope.get("app")
    if app is not None and hasattr(app, "routes"):
        for regex, template in _templates(app):
            if regex.match(scope.get("path", "")):
                return template
    return UNMATCHED


class MetricsMiddleware:
    """``esp_requests_total{route,status}`` (500 when the app raised before answering) and
    ``esp_request_duration_seconds{route}``; the route template is read after the app ran (the
    router fills the scope in)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            metrics = self.metrics
            template = route_template(scope)
            metrics.child(metrics.requests, template, str(status)).inc()
            metrics.child(metrics.request_duration, template).observe(time.perf_counter() - t0)


class BodyLimitMiddleware:
    """413 for bodies over ``max_bytes``: by ``Content-Length`` up front, else counted as streamed.

    The 413 says ``Connection: close``: the rest of the body is not read; the HTTP protocol
    (:mod:`esp_retrieval.service.http_limits`) closes lingering, so a client still sending reads the 413.

    Without a Content-Length (a chunked upload) the body, bounded by the limit, is read before
    the app runs and replayed to it, so an upload that grows past the limit is refused before
    any handler sees it. With one, the HTTP server delivers exactly that many bytes, so the
    body streams through untouched.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Send) -> None:
        message = f"request body is larger than the limit of {self.max_bytes} bytes"
        await send_error(send, ErrorKind.PAYLOAD_TOO_LARGE, message, close=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                too_big = False  # the server rejects a malformed Content-Length itself
            if too_big:
                await self._too_large(send)
                return
            if declared.isdigit():  # the HTTP server delivers exactly Content-Length bytes: no counting
                await self.app(scope, receive, send)
                return
        buffered: list[Message] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                buffered.append(message)  # disconnect: let the app see it
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._too_large(send)
                return
            buffered.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if buffered:
                return buffered.pop(0)
            return await receive()

        await self.app(scope, replay, send)


class RequestIdMiddleware:
    """Take the caller's ``X-Request-ID`` (a plain token of at most 128 characters) or make one,
    hold it in :data:`service.logs.REQUEST_ID` while the request runs, echo it in the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers") or () if k == b"x-request-id"), None)
        request_id = request_id_from(header)
        raw = request_id.encode("ascii")
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", raw)]}
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
