"""Pure-ASGI middleware: request metrics by route template, the request body size limit, and
the request id (:class:`RequestIdMiddleware`, outermost: every log line of a request carries it).

Pure ASGI (not ``BaseHTTPMiddleware``) so streaming and the event loop stay untouched and the
route template is read from the scope the router filled in.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.admission import ARRIVED, SLICES, AdaptiveLimit
from service.errors import ErrorKind, error_body
from service.http_limits import RECEIVED
from service.logs import REQUEST_ID, request_id_from
from service.metrics import Metrics

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


class AdmissionMiddleware:
    """Early 429 for ``POST /v1/search`` when its answer would come after the latency objective
    (``ESP_LATENCY_BUDGET_MS``), or when too many searches are in progress.

    Before the body is read or parsed (the cheap way to refuse, so a saturated event loop sheds
    load instead of parsing work it will refuse), a search is refused when

    - the searches in progress (admitted here, not yet answered) reach the in-flight limit:
      ``ESP_MAX_INFLIGHT_SEARCHES`` when set, else adapted to the latency objective from the
      latency measured of the searches answered (:class:`service.admission.AdaptiveLimit`); or
    - the event loop's lag (:class:`service.admission.LoopLag`: about how long its bytes waited
      in the socket before the server read them), plus the time since its headers were complete
      (the scope stamp of :mod:`service.http_limits`), plus the micro-batcher's expected wait for
      one more query (:meth:`service.batching.MicroBatcher.expected_wait`) exceed the budget.

    ``Retry-After`` is the queue's (or the in-flight searches') drain time at the measured rate,
    at least 1 s. An admitted search runs with :data:`service.admission.ARRIVED` set to its
    estimated arrival, so the micro-batcher can shed it at dequeue if it waits out the budget.
    """

    def __init__(self, app: ASGIApp, path: str = "/v1/search") -> None:
        self.app = app
        self.path = path
        self.inflight = 0  # searches admitted here and not yet answered
        self.adaptive: AdaptiveLimit | None = None  # made at the first search (it needs the budget)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.path):
            await self.app(scope, receive, send)
            return
        batcher = getattr(getattr(scope.get("app"), "state", None), "batcher", None)
        if batcher is None:
            await self.app(scope, receive, send)
            return
        now = time.monotonic()
        received = scope.get(RECEIVED)
        lag = batcher.lag.lag(now) if hasattr(batcher, "lag") else 0.0
        arrived = (received if isinstance(received, float) else now) - lag
        refusal = self._refusal(scope, batcher, now, now - arrived)
        if refusal is not None:
            message, retry_after = refusal
            await _send_json(
                send, 429, error_body(ErrorKind.OVERLOADED, message),
                headers=[(b"retry-after", str(max(1, math.ceil(retry_after))).encode())],
            )
            return
        self.inflight += 1
        token, slices = ARRIVED.set(arrived), SLICES.set(1)

        lag = batcher.lag.lag if hasattr(batcher, "lag") else (lambda: 0.0)

        async def timed_receive() -> Message:
            """The time spent waiting for the client's body is the client's, not a wait for the
            server: it moves the arrival on (a body sent with its headers costs nothing)."""
            t0 = time.monotonic()
            message = await receive()
            if message["type"] == "http.request":
                for_client = time.monotonic() - t0 - lag()  # what the loop's own lag does not explain
                current = ARRIVED.get()
                if for_client > 0 and current is not None:
                    ARRIVED.set(current + for_client)
            return message

        try:
            await self.app(scope, timed_receive, send)
        finally:
            done = time.monotonic()
            if self.adaptive is not None:
                self.adaptive.answered((done - (ARRIVED.get() or arrived)) / SLICES.get(), done)
            ARRIVED.reset(token)
            SLICES.reset(slices)
            self.inflight -= 1

    def _limit(self, scope: Scope, batcher: Any) -> tuple[int | None, str]:
        """The in-flight limit now, and what sets it."""
        fixed = getattr(getattr(scope["app"].state, "settings", None), "max_inflight_searches", None)
        if fixed is not None:
            return fixed, "the limit ESP_MAX_INFLIGHT_SEARCHES"
        budget = getattr(batcher, "latency_budget", None)
        if budget is None:
            return None, ""
        if self.adaptive is None:
            initial, ceiling = getattr(batcher, "max_batch", 64), getattr(batcher, "queue_size", 1024)
            self.adaptive = AdaptiveLimit(budget, initial=initial, ceiling=ceiling)
        return self.adaptive.limit, (
            f"the most the server answers within the latency budget of {budget * 1000:.0f} ms now "
            "(adapted to the latency measured; setting ESP_LATENCY_BUDGET_MS)"
        )

    def _refusal(self, scope: Scope, batcher: Any, now: float, waited: float) -> tuple[str, float] | None:
        budget = getattr(batcher, "latency_budget", None)
        limit, how = self._limit(scope, batcher)
        if limit is not None and self.inflight >= limit:
            if self.adaptive is not None:
                self.adaptive.refused()
            per_request = getattr(batcher, "seconds_per_request", lambda _: None)(now)
            message = f"overloaded: {self.inflight} searches are in progress, {how}; retry later"
            return message, self.inflight * per_request if per_request else 1.0
        if budget is None:
            return None
        ahead = batcher.expected_wait(1, now)
        if waited + ahead <= budget:
            return None
        message = (
            f"overloaded: this request waited about {waited * 1000:.0f} ms for the server and the "
            f"queries ahead would take about {ahead * 1000:.0f} ms, over the latency budget of "
            f"{budget * 1000:.0f} ms "
            "(setting ESP_LATENCY_BUDGET_MS); retry later"
        )
        return message, max(ahead, waited)


async def _send_json(
    send: Send,
    status: int,
    body: dict[str, Any],
    *,
    close: bool = False,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *(headers or []),
    ]
    if close:  # the body was not read: the server closes (lingering) instead of reading it all
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class BodyLimitMiddleware:
    """413 for bodies over ``max_bytes``: by ``Content-Length`` up front, else counted as streamed.

    The 413 says ``Connection: close``: the rest of the body is not read; the HTTP protocol
    (:mod:`service.http_limits`) closes lingering, so a client still sending reads the 413.

    Without a Content-Length (a chunked upload) the body, bounded by the limit, is read before
    the app runs and replayed to it, so an upload that grows past the limit is refused before
    any handler sees it. With one, the HTTP server delivers exactly that many bytes, so the
    body streams through untouched.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> dict[str, Any]:
        return error_body(
            ErrorKind.PAYLOAD_TOO_LARGE, f"request body is larger than the limit of {self.max_bytes} bytes"
        )

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
                await _send_json(send, 413, self._too_large(), close=True)
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
                await _send_json(send, 413, self._too_large(), close=True)
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
