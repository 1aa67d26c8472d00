"""esp_retrieval/client/client.py: a 429 or 503 answer is sent again by default, after the server's
Retry-After with jitter, a bounded number of times; any other error is raised at once. Against a
real loopback HTTP server (the stdlib's, in a thread) that answers a script, sync and async.

The waits are recorded, not slept: what is checked is how long the client chose to wait.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from esp_retrieval.client.client import (
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_RETRIES,
    AsyncESPClient,
    ESPClient,
    ESPError,
)

SEARCH_ANSWER = {
    "results": [{"hits": [{"id": "d1", "score": 0.5, "subspace_scores": {"a": 0.5}}]}],
    "weights_used": {"a": 1.0},
    "bundle_version": "v1",
    "backend": "numpy",
}
READY = {"status": "ready", "bundle_version": "v1"}

Answer = tuple[int, dict[str, str], dict[str, Any]]


def busy(status: int, retry_after: str | None = None) -> Answer:
    kind = {429: "overloaded", 503: "not_ready"}.get(status, "invalid")
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return status, headers, {"type": kind, "message": f"scripted {status}", "field": None}


@dataclass
class Scripted:
    """The server's script: answers given in order, then 200 with the route's answer; every request seen."""

    url: str
    script: list[Answer] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[Scripted]:
    state = Scripted("")

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            state.seen.append(f"{self.command} {self.path}")
            if state.script:
                status, headers, body = state.script.pop(0)
            else:
                status, headers, body = 200, {}, READY if self.path == "/readyz" else SEARCH_ANSWER
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {**headers, "Content-Type": "application/json"}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds the client chose to wait before each resend (sync and async), without waiting."""
    chosen: list[float] = []

    async def asleep(seconds: float) -> None:
        chosen.append(seconds)

    monkeypatch.setattr("esp_retrieval.client.client._sleep", chosen.append)
    monkeypatch.setattr("esp_retrieval.client.client._asleep", asleep)
    return chosen


def search(url: str, mode: str, **options: Any) -> str:
    """One search through the sync or the async client; the first hit's id."""
    if mode == "sync":
        with ESPClient(url, **options) as c:
            return c.search([1.0, 0.0]).results[0].hits[0].id

    async def go() -> str:
        async with AsyncESPClient(url, **options) as ac:
            return (await ac.search([1.0, 0.0])).results[0].hits[0].id

    return asyncio.run(go())


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_a_429_is_sent_again_after_its_retry_after_by_default(
    server: Scripted, waits: list[float], mode: str
) -> None:
    server.script = [busy(429, retry_after="2")]
    assert search(server.url, mode) == "d1"
    assert server.seen == ["POST /v1/search"] * 2
    assert len(waits) == 1
    assert 2.0 <= waits[0] <= DEFAULT_MAX_RETRY_WAIT  # never sooner than asked; jitter on top, bounded


@pytest.mark.parametrize("mode", MODES)
def test_a_503_is_sent_again_with_or_without_retry_after(
    server: Scripted, waits: list[float], mode: str
) -> None:
    server.script = [busy(503), busy(503, retry_after="1")]
    assert search(server.url, mode) == "d1"
    assert server.seen == ["POST /v1/search"] * 3
    assert 0.0 <= waits[0] <= 0.1  # no header: a random wait below the first backoff step
    assert 1.0 <= waits[1] <= DEFAULT_MAX_RETRY_WAIT


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", [400, 404, 409, 422])
def test_other_errors_are_not_sent_again(server: Scripted, waits: list[float], mode: str, status: int) -> None:
    server.script = [busy(status, retry_after="1")]
    with pytest.raises(ESPError) as err:
        search(server.url, mode)
    assert err.value.status == status
    assert server.seen == ["POST /v1/search"] and waits == []


@pytest.mark.parametrize("mode", MODES)
def test_resends_are_bounded_then_the_last_answer_raises(
    server: Scripted, waits: list[float], mode: str
) -> None:
    server.script = [busy(429, retry_after="0")] * 10
    with pytest.raises(ESPError) as err:
        search(server.url, mode, retries=2, max_retry_wait=0.5)
    assert (err.value.status, err.value.retry_after) == (429, 0.0)
    assert len(server.seen) == 3 and len(waits) == 2
    assert all(0.0 <= w <= 0.5 for w in waits)

    server.seen.clear()
    server.script = [busy(503)] * (DEFAULT_RETRIES + 5)
    with pytest.raises(ESPError):
        search(server.url, mode)
    assert len(server.seen) == DEFAULT_RETRIES + 1  # the default bound


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_after_beyond_the_longest_wait_raises_at_once(
    server: Scripted, waits: list[float], mode: str
) -> None:
    server.script = [busy(429, retry_after="30")]
    with pytest.raises(ESPError) as err:
        search(server.url, mode, max_retry_wait=5.0)
    assert (err.value.status, err.value.retry_after) == (429, 30.0)
    assert len(server.seen) == 1 and waits == []


@pytest.mark.parametrize("mode", MODES)
def test_retries_zero_turns_them_off(server: Scripted, waits: list[float], mode: str) -> None:
    server.script = [busy(429, retry_after="1")]
    with pytest.raises(ESPError) as err:
        search(server.url, mode, retries=0)
    assert err.value.status == 429 and len(server.seen) == 1 and waits == []


def test_the_readiness_probe_is_answered_not_resent(server: Scripted, waits: list[float]) -> None:
    server.script = [busy(503, retry_after="1")]
    with ESPClient(server.url) as c:
        with pytest.raises(ESPError) as err:
            c.ready()
        assert err.value.status == 503
        assert c.ready().status == "ready"
    assert server.seen == ["GET /readyz"] * 2 and waits == []


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="retries"):
        ESPClient("http://127.0.0.1:1", retries=-1)
    with pytest.raises(ValueError, match="max_retry_wait"):
        AsyncESPClient("http://127.0.0.1:1", max_retry_wait=-1.0)
