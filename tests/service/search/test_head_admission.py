"""Searches refused at their headers by the HTTP protocol (esp_retrieval.service.http_limits with
esp_retrieval.service.search.admission.HeadAdmission): no app runs for them, their body is read and dropped,
the connection stays usable; and where the protocol must leave the decision to the app."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from esp_retrieval.service.http_limits import (
    ADMITTED_AT_HEAD,
    HEAD_ADMISSION,
    HttpLimits,
    LimitedHttpToolsProtocol,
)
from esp_retrieval.service.search.admission import HeadAdmission
from tests.service.search.test_admission import FakeBatcher, _pipeline

REFUSAL = (429, [(b"content-type", b"application/json"), (b"content-length", b"2"), (b"retry-after", b"1")], b"{}")


class App:
    """An ASGI app that answers 200 with the path and records the scopes it saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append({**scope, "body": body})
        payload = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


@asynccontextmanager
async def serve(check: Callable[..., Any], max_body: int = 1024) -> AsyncIterator[tuple[int, App]]:
    """The protocol on a loopback port, with ``check`` as the head admission."""
    app = App()
    config = uvicorn.Config(app, http=LimitedHttpToolsProtocol, lifespan="off", log_level="warning")
    config.load()
    LimitedHttpToolsProtocol.limits = HttpLimits(max_body, 8192, 100, 5.0, 5.0, 1.0)
    state: dict[str, Any] = {HEAD_ADMISSION: check}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: LimitedHttpToolsProtocol(config=config, server_state=ServerState(), app_state=state),
        "127.0.0.1", 0,
    )
    try:
        yield server.sockets[0].getsockname()[1], app
    finally:
        server.close()
        LimitedHttpToolsProtocol.limits = None


def post(body: bytes, *extra: str) -> bytes:
    head = ["POST /v1/search HTTP/1.1", "host: x", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def answers(port: int, data: bytes, count: int) -> list[bytes]:
    """Send ``data`` on one connection and read ``count`` answers (Content-Length framed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    out = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        while head.startswith(b"HTTP/1.1 1"):  # 100 Continue: the answer follows
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        out.append(head + await reader.readexactly(length))
    writer.close()
    return out


def test_a_refused_search_runs_no_app_and_its_connection_serves_the_next_request() -> None:
    calls: list[tuple[bytes, bytes]] = []

    def check(method: bytes, target: bytes, headers: Any, received: float) -> Any:
        calls.append((method, target))
        return REFUSAL if target == b"/v1/search" else None

    async def main() -> None:
        async with serve(check) as (port, app):
            body = b'{"queries": [{"text": "' + b"x" * 500 + b'"}]}'
            after = b"POST /after HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
            got = await answers(port, post(body) + after, 2)
            assert got[0].startswith(b"HTTP/1.1 429") and got[0].endswith(b"{}")
            assert b"retry-after: 1" in got[0]
            assert got[1].startswith(b"HTTP/1.1 200") and got[1].endswith(b"/after")  # the body was dropped whole
            assert [s["path"] for s in app.seen] == ["/after"]  # the refused search reached no app
            assert app.seen[0][ADMITTED_AT_HEAD] is True  # let through: the app's forecast is skipped

    asyncio.run(main())
    assert calls == [(b"POST", b"/v1/search"), (b"POST", b"/after")]


def test_connection_close_is_honoured_after_a_head_refusal() -> None:
    async def main() -> None:
        async with serve(lambda *a: REFUSAL) as (port, app):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post(b"{}", "connection: close"))
            data = await asyncio.wait_for(reader.read(), 5)  # returns at the server's close
            assert data.startswith(b"HTTP/1.1 429") and b"connection: close" in data
            assert app.seen == []
            writer.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "request_bytes",
    [
        post(b"{}", "expect: 100-continue"),  # the client waits for a go-ahead before its body
        post(b"x" * 2048),  # a body over the limit: the body limit's 413, not a 429
        b"POST /v1/search HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ],
    ids=["expect-100", "over-the-body-limit", "chunked"],
)
def test_the_head_check_is_not_asked_where_the_app_must_decide(request_bytes: bytes) -> None:
    asked: list[bytes] = []

    async def main() -> None:
        async with serve(lambda m, t, h, r: asked.append(t) or REFUSAL) as (port, app):
            got = await answers(port, request_bytes, 1)
            assert got[0].startswith(b"HTTP/1.1 200")  # this app answers anything it is given
            assert len(app.seen) == 1

    asyncio.run(main())
    assert asked == []


def test_head_admission_refuses_by_forecast_counts_it_and_echoes_the_request_id() -> None:
    pipeline = _pipeline(FakeBatcher(latency_budget=0.01, wait_per_query=0.05))
    check = HeadAdmission(pipeline)
    assert check(b"GET", b"/v1/search", [], 0.0) is None
    assert check(b"POST", b"/v1/models", [], 0.0) is None
    status, headers, payload = check(b"POST", b"/v1/search?x=1", [(b"x-request-id", b"abc-1")], time.monotonic())
    assert status == 429 and b"latency budget of 10 ms" in payload
    assert (b"x-request-id", b"abc-1") in headers and (b"retry-after", b"1") in headers
    metrics = pipeline.metrics
    assert metrics.child(metrics.admission_refusals, "forecast")._value.get() == 1
    assert metrics.child(metrics.requests, "/v1/search", "429")._value.get() == 1
    pipeline.batcher.idle = True  # an idle engine admits whatever the last batch cost
    assert check(b"POST", b"/v1/search", [], time.monotonic()) is None
