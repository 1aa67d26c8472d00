"""service/client.py's wired path (prepared bytes to the lean transport) sends what httpx sends
and behaves as the httpx path does: cookies, logging, exceptions, and when it steps aside."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

from service.client import AsyncESPClient, ESPClient
from service.client_transport import AsyncHTTP11Transport, HTTP11Transport
from tests.service.test_client_transport import Scripted, ok, scripted_servers

ANSWER = (
    b'{"results":[{"hits":[{"id":"d1","score":0.5,"subspace_scores":{"a":0.5}}]}],'
    b'"weights_used":{"a":1.0},"bundle_version":"v1","backend":"numpy"}'
)
Q = np.array([0.5, -0.25, 1e-3], dtype=np.float32)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    yield from scripted_servers()


def _lines(head: bytes) -> tuple[bytes, set[bytes]]:
    first, *rest = head.split(b"\r\n")
    return first, set(rest)


def test_wired_search_sends_the_bytes_httpx_sends(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(ANSWER))
    with ESPClient(srv.url + "/base") as wired:
        assert wired._build.wire(wired._calls.search(Q)) is not None
        a = wired.search(Q, k=3, weights={"a": 1.0})
    # a given transport (even the lean one) sends through httpx's client
    with ESPClient(srv.url + "/base", transport=HTTP11Transport()) as plain:
        assert plain._build.wire(plain._calls.search(Q)) is None
        b = plain.search(Q, k=3, weights={"a": 1.0})
    assert a == b
    (w, p) = srv.seen
    assert _lines(w.head) == _lines(p.head)
    assert _lines(w.head)[0] == b"POST /base/v1/search HTTP/1.1"
    assert w.body == p.body


@pytest.mark.asyncio
async def test_async_wired_calls_send_the_bytes_httpx_sends(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(b'{"status":"ok"}' if b"/healthz" in s.head else ANSWER))
    async with AsyncESPClient(srv.url) as wired:
        await wired.search(["a text"], operating_point="op")
        await wired.health()
    async with AsyncESPClient(srv.url, transport=AsyncHTTP11Transport()) as plain:
        await plain.search(["a text"], operating_point="op")
        await plain.health()
    w_search, w_health, p_search, p_health = srv.seen
    assert _lines(w_search.head) == _lines(p_search.head) and w_search.body == p_search.body
    assert _lines(w_health.head) == _lines(p_health.head) and w_health.body == p_health.body == b""


def test_cookies_from_a_wired_answer_go_back_with_the_next_request(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(ANSWER, extra=b"Set-Cookie: sticky=1; Path=/\r\n" if n == 1 else b""))
    with ESPClient(srv.url) as c:
        c.search(Q)
        assert c._build.wire(c._calls.search(Q)) is None  # a cookie in the jar: httpx's path
        c.search(Q)
    assert not any(line.lower().startswith(b"cookie:") for line in srv.seen[0].head.split(b"\r\n"))
    assert b"cookie: sticky=1" in srv.seen[1].head.lower()


def test_wired_requests_are_logged_like_httpx(
    scripted: Callable[..., Scripted], caplog: pytest.LogCaptureFixture
) -> None:
    srv = scripted(lambda n, s: ok(ANSWER))
    with caplog.at_level(logging.INFO, logger="httpx"), ESPClient(srv.url) as c:
        c.search(Q)
    assert f'HTTP Request: POST {srv.url}/v1/search "HTTP/1.1 200 OK"' in caplog.messages


def test_transport_errors_carry_the_request_as_httpx_does() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    with ESPClient(url) as c, pytest.raises(httpx.ConnectError) as err:
        c.search(Q)
    assert err.value.request.url == httpx.URL(url + "/v1/search")

    async def go() -> httpx.Request:
        async with AsyncESPClient(url) as ac:
            try:
                await ac.search(Q)
            except httpx.ConnectError as exc:
                return exc.request
        raise AssertionError("no error")

    assert asyncio.run(go()).method == "POST"


def test_the_wired_path_steps_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    with ESPClient("http://h:1") as c:
        assert c._build.wire(c._calls.search(Q)) is None  # httpx routes through the proxy
    monkeypatch.delenv("HTTP_PROXY")
    with ESPClient("http://h:1") as c:
        call = c._calls.search(Q)
        assert c._build.wire(call) is not None
        assert c._build.wire(c._calls.assignment("exp", "u")) is None  # query params
        assert c._build.wire(c._calls.reload("p", token="t")) is None  # own headers
        c._http.event_hooks = {"request": [lambda r: None]}
        assert c._build.wire(call) is None
    with ESPClient("https://h:1") as c:
        assert c._build.wire(c._calls.search(Q)) is None


def test_a_closed_client_refuses_as_httpx_does(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(ANSWER))
    c = ESPClient(srv.url)
    c.search(Q)
    c.close()
    with pytest.raises(RuntimeError, match="client has been closed"):
        c.search(Q)
    assert len(srv.seen) == 1
