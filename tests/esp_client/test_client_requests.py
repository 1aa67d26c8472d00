"""esp_client/client.py: it sends through httpx's own transport (or the one, or the httpx client, it is
given), and answers (typed results, ESPError, retries) are judged the same, sync and async."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from esp_client.client import AsyncESPClient, ESPClient, ESPError

SEARCH_ANSWER = {
    "results": [{"hits": [{"id": "d1", "score": 0.5, "subspace_scores": {"a": 0.5}}]}],
    "weights_used": {"a": 1.0},
    "bundle_version": "v1",
    "backend": "numpy",
}


def test_cookies_set_by_the_server_are_sent_back() -> None:
    sent: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("cookie"))
        return httpx.Response(200, json=SEARCH_ANSWER, headers={"set-cookie": "sticky=1; Path=/"})

    with ESPClient("http://h:1", transport=httpx.MockTransport(handler)) as c:
        c.search([1.0, 0.0])
        c.search([1.0, 0.0])
    assert sent == [None, "sticky=1"]


def test_default_transports_are_httpx_own_and_a_given_one_is_used() -> None:
    with ESPClient("http://h:1") as c:
        assert isinstance(c._http._transport, httpx.HTTPTransport)

    async def check() -> None:
        async with AsyncESPClient("http://h:1", max_connections=3) as ac:
            transport = ac._http._transport
            assert isinstance(transport, httpx.AsyncHTTPTransport)
            assert transport._pool._max_connections == 3
        mock = httpx.MockTransport(lambda r: httpx.Response(200, json=SEARCH_ANSWER))
        async with AsyncESPClient("http://h:1", transport=mock) as ac:
            assert ac._http._transport is mock
            assert (await ac.search([1.0, 0.0])).results[0].hits[0].id == "d1"

    asyncio.run(check())


def test_a_given_httpx_client_is_used_and_left_open() -> None:
    urls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return httpx.Response(200, json=SEARCH_ANSWER)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    with ESPClient("http://h:1/base/", http_client=http) as c:
        assert c.search([1.0, 0.0]).results[0].hits[0].id == "d1"
    assert urls == ["http://h:1/base/v1/search"]
    assert not http.is_closed  # the caller owns it
    http.close()

    async def check() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as ahttp:
            async with AsyncESPClient("http://h:2", http_client=ahttp) as ac:
                await ac.search([1.0, 0.0])
            assert not ahttp.is_closed

    asyncio.run(check())
    assert urls[-1] == "http://h:2/v1/search"
    with httpx.Client() as other, pytest.raises(ValueError, match="not both"):
        ESPClient("http://h:1", http_client=other, transport=httpx.MockTransport(handler))


def _overloaded(request: httpx.Request) -> httpx.Response:
    body = {"type": "overloaded", "message": "queue full", "field": None}
    return httpx.Response(429, json=body, headers={"retry-after": "2"})


def test_errors_are_esp_errors_sync_and_async() -> None:
    with (
        ESPClient("http://h:1", transport=httpx.MockTransport(_overloaded)) as c,
        pytest.raises(ESPError) as err,
    ):
        c.search([1.0, 0.0])
    assert (err.value.status, err.value.type, err.value.retry_after) == (429, "overloaded", 2.0)

    async def go() -> ESPError:
        async with AsyncESPClient("http://h:1", transport=httpx.MockTransport(_overloaded)) as ac:
            try:
                await ac.search([1.0, 0.0])
            except ESPError as e:
                return e
        raise AssertionError("no error")

    aerr = asyncio.run(go())
    assert (aerr.status, aerr.type, aerr.retry_after) == (429, "overloaded", 2.0)


def test_search_body_reaches_the_transport_as_the_api_json() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=SEARCH_ANSWER)

    with ESPClient("http://h:1/base", transport=httpx.MockTransport(handler)) as c:
        res = c.search(np.array([0.5, 0.25], dtype=np.float32), k=4, experiment="e", unit_id="u")
    assert res.results[0].hits[0].subspace_scores == {"a": 0.5}
    req = seen[0]
    assert str(req.url) == "http://h:1/base/v1/search"
    assert req.headers["content-type"] == "application/json"
    assert json.loads(req.content) == {
        "queries": [{"vector": [0.5, 0.25]}],
        "k": 4,
        "experiment": "e",
        "unit_id": "u",
    }


def _queue_full() -> httpx.Response:
    return _overloaded(httpx.Request("POST", "http://h:1/v1/search"))


def _busy_then_ok(busy: list[httpx.Response]):
    """A transport handler answering the scripted busy responses first, then the search answer."""
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        return busy.pop(0) if busy else httpx.Response(200, json=SEARCH_ANSWER)

    return handler, sent


def test_retries_wait_retry_after_then_answer_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("esp_client.client.time.sleep", slept.append)
    not_ready = httpx.Response(503, json={"type": "not_ready", "message": "loading", "field": None})
    handler, sent = _busy_then_ok([_queue_full(), not_ready])
    with ESPClient("http://h:1", retries=2, max_retry_wait=1.5, transport=httpx.MockTransport(handler)) as c:
        assert c.search([1.0, 0.0]).results[0].hits[0].id == "d1"
    assert len(sent) == 3
    assert slept == [1.5, 0.2]  # Retry-After 2 capped at 1.5; no header: 0.1 s doubled on attempt 2


def test_retries_run_out_and_other_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("esp_client.client.time.sleep", lambda s: None)
    handler, sent = _busy_then_ok([_queue_full(), _queue_full()])
    with (
        ESPClient("http://h:1", retries=1, transport=httpx.MockTransport(handler)) as c,
        pytest.raises(ESPError) as err,
    ):
        c.search([1.0, 0.0])
    assert err.value.status == 429 and len(sent) == 2
    bad = httpx.Response(422, json={"type": "invalid", "message": "k out of range", "field": "k"})
    handler, sent = _busy_then_ok([bad])
    with (
        ESPClient("http://h:1", retries=3, transport=httpx.MockTransport(handler)) as c,
        pytest.raises(ESPError) as err,
    ):
        c.search([1.0, 0.0])
    assert err.value.status == 422 and len(sent) == 1


def test_retries_async(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr("esp_client.client.asyncio.sleep", fake_sleep)
    handler, sent = _busy_then_ok([_queue_full()])

    async def go() -> str:
        async with AsyncESPClient("http://h:1", retries=1, transport=httpx.MockTransport(handler)) as ac:
            return (await ac.search([1.0, 0.0])).results[0].hits[0].id

    assert asyncio.run(go()) == "d1"
    assert slept == [2.0] and len(sent) == 2
