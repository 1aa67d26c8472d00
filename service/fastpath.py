"""A pure-ASGI fast path for well-formed ``POST /v1/search`` requests.

Why: FastAPI's routing, dependency solving and exception layers cost more event-loop CPU per
request than the route's own work (measured on the 2-core machine under a cheap load
client: ~1.3 ms of event-loop CPU per search request through FastAPI; a no-op FastAPI POST
endpoint ~0.35 ms, a bare ASGI app ~0.09 ms), and on two cores that CPU is taken from the
engine, which is what micro-batching is there to feed.

What: installed as the innermost middleware (inside the metrics and body-limit middleware,
so both still see every request), it takes a POST to exactly ``/v1/search`` with an
``application/json`` body, parses it with pydantic-core and validates it against
:class:`~service.schemas.SearchRequest`. When that succeeds and a bundle is served, it runs
the route's own :func:`~service.routes.search.run_search` and answers; a
:class:`ServiceError` from it is answered as the app's handler answers it. Everything else (a
malformed or invalid body, another content type or method, no bundle yet) is replayed
unchanged to the FastAPI app, so those statuses and messages, and the OpenAPI schema, come
from the one declared route exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic_core
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ServiceError
from service.routes.deps import SearchContext
from service.routes.search import run_search
from service.schemas import SearchRequest
from service.state import StateHolder

SEARCH_PATH = "/v1/search"


@dataclass(frozen=True)
class _Matched:
    """Stands in for the matched route in ``scope["route"]``: the metrics read its ``path``."""

    path: str


_ROUTE = _Matched(SEARCH_PATH)


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _parse(body: bytes) -> SearchRequest | None:
    """The validated body, or None when FastAPI's own parsing should answer (with its error)."""
    if not body:
        return None
    try:
        return SearchRequest.model_validate(pydantic_core.from_json(body))
    except (ValueError, ValidationError):  # pydantic-core's JSON error is a ValueError
        return None


class SearchFastPath:
    """ASGI middleware: answer valid searches directly, replay everything else to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != SEARCH_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if not _is_json(scope):
            await self.app(scope, receive, send)
            return
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
        app_state = scope["app"].state
        holder: StateHolder = app_state.holder
        body = _parse(b"".join(chunks)) if messages[-1]["type"] == "http.request" else None
        state = holder.current
        if body is None or state is None:

            async def replay() -> Message:
                return messages.pop(0) if messages else await receive()

            await self.app(scope, replay, send)
            return
        scope["route"] = _ROUTE
        ctx = SearchContext(
            state, app_state.settings, app_state.batcher, app_state.metrics, app_state.registry
        )
        try:
            result = await run_search(body, ctx)
        except ServiceError as exc:  # as the app's ServiceError handler answers it
            await exc.response()(scope, receive, send)
            return
        await _send_json(send, result)


async def _send_json(send: Send, content: Any) -> None:
    payload = pydantic_core.to_json(content)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
