"""esp_retrieval/client/client.py: it sends through httpx's own transport (or the one, or the httpx client, it is
given), and answers (typed results, ESPError) are judged the same, sync and async (retries:
test_client_retries.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from esp_retrieval.client.client import AsyncESPClient, ESPClient, ESPError

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
        ESPClient("http://h:1", retries=0, transport=httpx.MockTransport(_overloaded)) as c,
        pytest.raises(ESPError) as err,
    ):
        c.search([1.0, 0.0])
    assert (err.value.status, err.value.type, err.value.retry_after) == (429, "overloaded", 2.0)

    async def go() -> ESPError:
        async with AsyncESPClient("http://h:1", retries=0, transport=httpx.MockTransport(_overloaded)) as ac:
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
