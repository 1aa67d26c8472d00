"""Admission by expected wait, batch-sized slices served round-robin, and dropping the queued work
of a client that went away (esp_retrieval.service.search.batching)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

from esp_retrieval.service.errors import STATUS, ClientClosedError, OverloadedError, error_headers, error_kind
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.search.wait import Arrival, LoopLag
from tests.service.search.test_batching import _batcher, _state, _vectors


def _pipeline(batcher: Any, max_inflight_searches: int | None = None) -> Any:
    """What the admission middleware reads of the search pipeline: its batcher and settings."""
    from types import SimpleNamespace

    from esp_retrieval.service.config import Settings

    settings = Settings(max_inflight_searches=max_inflight_searches)
    return SimpleNamespace(batcher=batcher, settings=settings, metrics=Metrics())


@dataclass
class FakeBatcher:
    """What the admission middleware reads of the micro-batcher, set per test."""

    latency_budget: float = 0.25
    wait_per_query: float = 0.0  # expected_wait(n) = n x this
    per_request: float | None = None  # seconds_per_request
    idle: bool = False
    lag: LoopLag = field(default_factory=LoopLag)  # not started: no lag
    max_batch: int = 64
    queue_size: int = 1024

    def expected_wait(self, n: int, now: float | None = None) -> float:
        return self.wait_per_query * n

    def seconds_per_request(self, now: float | None = None) -> float | None:
        return self.per_request


async def _body() -> dict[str, Any]:
    """An ASGI receive whose body arrived with its headers."""
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def _hold(b: Any, state: Any) -> asyncio.Task[Any]:
    """One job in the engine, held at the gate, so what follows queues."""
    state.engine.gate.clear()
    busy = asyncio.create_task(b.submit(state, _vectors(1, 0), np.ones(2), 1))
    await asyncio.to_thread(state.engine.entered.wait, 10)
    return busy


def test_a_request_that_would_wait_past_the_budget_is_429_with_retry_after_from_the_rate(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), queue_size=1000, max_wait_ms=0, latency_budget_ms=50.0)
        await b.start()
        now = time.monotonic()
        b._batches.extend([(now, 10, 0.1), (now, 10, 0.1)])  # measured: 10 ms per query
        busy = await _hold(b, state)
        queued = asyncio.create_task(b.submit(state, _vectors(3, 1), np.ones(2), 1))  # 30 ms ahead
        await asyncio.sleep(0.01)
        assert b.depth == 3
        with pytest.raises(OverloadedError) as err:  # 3 + 3 queued queries: about 60 ms > 50 ms
            await b.submit(state, _vectors(3, 2), np.ones(2), 1)
        assert STATUS[error_kind(err.value)] == 429
        assert 0.05 < err.value.retry_after < 1.0  # the queue's drain time at the measured rate
        assert error_headers(err.value)["Retry-After"] == "1"
        assert "latency budget of 50 ms" in err.value.message
        one = asyncio.create_task(b.submit(state, _vectors(1, 3), np.ones(2), 1))  # 40 ms: admitted
        state.engine.gate.set()  # type: ignore[attr-defined]
        await asyncio.gather(busy, queued, one)
        await b.stop()

    asyncio.run(run())


def test_a_large_search_has_the_budget_once_per_slice(tmp_path: Path) -> None:
    """A search of two micro-batches is admitted behind a busy engine when its wait fits twice the
    budget (it was refused at once: 50 ms for 8 queries at 10 ms each), and refused past that."""
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), queue_size=1000, max_wait_ms=0, latency_budget_ms=50.0, max_batch=4)
        await b.start()
        now = time.monotonic()
        b._batches.extend([(now, 4, 0.04), (now, 4, 0.04)])  # measured: 10 ms per query
        busy = await _hold(b, state)
        two_slices = asyncio.create_task(b.submit(state, _vectors(8, 1), np.ones(2), 1))  # ~80-90 ms <= 100
        await asyncio.sleep(0.01)
        assert b.depth == 8
        with pytest.raises(OverloadedError) as err:  # 8 ahead + its own 8: ~160 ms > 2 x 50 ms
            await b.submit(state, _vectors(8, 2), np.ones(2), 1)
        assert "latency budget of 50 ms per 4 queries (2 slices)" in err.value.message
        state.engine.gate.set()  # type: ignore[attr-defined]
        _, hits = await asyncio.gather(busy, two_slices)
        assert len(hits) == 8
        await b.stop()

    asyncio.run(run())


def test_the_rate_is_measured_from_the_batches_run(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> float | None:
        b = _batcher(Metrics(), max_wait_ms=0, latency_budget_ms=250.0)
        await b.start()
        assert b.seconds_per_query() is None  # nothing measured: nothing refused by wait
        for s in range(3):
            await b.submit(state, _vectors(2, s), np.ones(2), 3)
        spq = b.seconds_per_query()
        await b.stop()
        return spq

    spq = asyncio.run(run())
    assert spq is not None and spq > 0


def test_a_large_request_is_sliced_and_a_small_one_goes_between_its_slices(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> tuple[list[Any], list[Any]]:
        b = _batcher(Metrics(), max_batch=4, max_wait_ms=0, queue_size=100)
        await b.start()
        busy = await _hold(b, state)
        big = asyncio.create_task(b.submit(state, _vectors(12, 1), np.ones(2), 3))
        await asyncio.sleep(0.01)
        small = asyncio.create_task(b.submit(state, _vectors(1, 2), np.ones(2), 3))
        await asyncio.sleep(0.01)
        state.engine.gate.set()  # type: ignore[attr-defined]
        _, big_hits, small_hits = await asyncio.gather(busy, big, small)
        await b.stop()
        return big_hits, small_hits

    big_hits, small_hits = asyncio.run(run())
    assert state.engine.calls == [1, 4, 1, 4, 4]  # type: ignore[attr-defined]  # small after one slice
    assert len(big_hits) == 12 and len(small_hits) == 1
    q = np.stack([x.vector for x in _vectors(12, 1)])  # type: ignore[misc]
    expected = state.engine.engine.search(q, np.ones(2), 3).rows  # type: ignore[attr-defined]
    assert [h.rows.tolist() for h in big_hits] == expected.tolist()  # slices reassembled in order


def test_queued_work_of_a_disconnected_client_is_dropped(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), max_wait_ms=0, queue_size=100)
        await b.start()
        busy = await _hold(b, state)
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:  # the ASGI receive of a request whose body was read
            await gone.wait()
            return {"type": "http.disconnect"}

        left = asyncio.create_task(b.submit(state, _vectors(5, 1), np.ones(2), 3, receive))
        stays = asyncio.create_task(b.submit(state, _vectors(2, 2), np.ones(2), 3))
        await asyncio.sleep(0.01)
        assert b.depth == 7
        gone.set()
        with pytest.raises(ClientClosedError):
            await left
        assert b.depth == 2 and b.dropped == 5
        state.engine.gate.set()  # type: ignore[attr-defined]
        assert len(await stays) == 2
        await busy
        await b.stop()

    asyncio.run(run())
    assert state.engine.calls == [1, 2]  # type: ignore[attr-defined]  # the 5 dropped queries never ran


def test_a_search_that_already_waited_past_the_budget_is_refused_before_its_body_is_read() -> None:
    from esp_retrieval.service.http_limits import RECEIVED
    from esp_retrieval.service.search.admission import AdmissionMiddleware

    def Batcher() -> FakeBatcher:  # noqa: N802
        return FakeBatcher(wait_per_query=0.05, lag=LoopLag())  # lag not started: none

    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    reads: list[int] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        return await _body()

    async def run(waited: float, path: str = "/v1/search") -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": [],
            RECEIVED: time.monotonic() - waited,
        }
        await AdmissionMiddleware(app, _pipeline(Batcher()))(scope, receive, send)
        return sent

    late = asyncio.run(run(waited=0.3))
    assert late[0]["status"] == 429 and (b"retry-after", b"1") in late[0]["headers"]
    assert b"latency budget of 250 ms" in late[1]["body"]
    assert reads == []  # refused before its body was read
    assert asyncio.run(run(waited=0.1)) == [] and reached == ["/v1/search"]  # 100 + 50 ms: admitted
    assert asyncio.run(run(waited=0.3, path="/v1/cluster")) == []  # only the search is admitted by wait


def test_the_app_admits_searches_by_wait_before_reading_them() -> None:
    from esp_retrieval.service.app import create_app
    from esp_retrieval.service.config import Settings
    from esp_retrieval.service.middleware import BodyLimitMiddleware
    from esp_retrieval.service.search.admission import AdmissionMiddleware

    stack = [m.cls for m in create_app(Settings()).user_middleware]
    assert AdmissionMiddleware in stack
    assert stack.index(AdmissionMiddleware) > stack.index(BodyLimitMiddleware)  # inside the body limit


def test_a_queued_request_that_waited_out_the_budget_is_shed_at_dequeue_not_run(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), max_wait_ms=0, queue_size=100, latency_budget_ms=20.0)
        await b.start()
        busy = await _hold(b, state)  # nothing measured yet: the next one is admitted (no forecast)
        late = asyncio.create_task(
            b.submit(state, _vectors(2, 1), np.ones(2), 3, arrival=Arrival(time.monotonic()))
        )
        await asyncio.sleep(0.01)
        assert b.depth == 2
        while time.monotonic() - late_arrival(b) <= 0.02:  # until it has waited out the 20 ms budget
            await asyncio.sleep(0.005)
        state.engine.gate.set()  # type: ignore[attr-defined]
        with pytest.raises(OverloadedError) as err:
            await late
        assert "before the engine could take it" in err.value.message
        assert error_headers(err.value)["Retry-After"] == "1"
        await busy
        assert b.depth == 0 and b.shed == 1
        fresh = await b.submit(
            state, _vectors(1, 2), np.ones(2), 3, arrival=Arrival(time.monotonic())
        )  # idle: runs
        assert len(fresh) == 1
        await b.stop()

    def late_arrival(b: Any) -> float:
        (req,) = b._queue
        return float(req.arrived)

    asyncio.run(run())
    assert state.engine.calls == [1, 1]  # type: ignore[attr-defined]  # the shed request never ran


def test_the_wait_since_arrival_counts_against_the_budget_at_submit(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), queue_size=1000, max_wait_ms=0, latency_budget_ms=50.0)
        await b.start()
        now = time.monotonic()
        b._batches.extend([(now, 10, 0.01), (now, 10, 0.01)])  # measured: 1 ms per query
        busy = await _hold(b, state)
        with pytest.raises(OverloadedError) as err:  # 2 ms of queue, but it arrived 60 ms ago
            await b.submit(state, _vectors(1, 1), np.ones(2), 1, arrival=Arrival(time.monotonic() - 0.06))
        assert "ms waited" in err.value.message
        ok = asyncio.create_task(
            b.submit(state, _vectors(1, 2), np.ones(2), 1, arrival=Arrival(time.monotonic()))
        )
        state.engine.gate.set()  # type: ignore[attr-defined]
        await asyncio.gather(busy, ok)
        await b.stop()

    asyncio.run(run())


def test_the_loop_lag_is_how_late_the_loop_runs_a_callback_that_was_due() -> None:

    async def run() -> tuple[float, float, float]:
        lag = LoopLag(interval=0.005)
        lag.start()
        await asyncio.sleep(0.02)
        idle = lag.lag()
        time.sleep(0.1)  # the loop is blocked: the callback due 5 ms after the last one cannot run
        blocked = lag.lag()
        await asyncio.sleep(0)  # the overdue callback runs and records its lateness
        await asyncio.sleep(0.001)
        recorded = lag.last
        lag.stop()
        assert lag.lag() == 0.0  # stopped: no lag reported
        return idle, blocked, recorded

    idle, blocked, recorded = asyncio.run(run())
    assert blocked >= 0.1 - 0.005 and recorded >= 0.1 - 0.005
    assert idle < blocked


def test_a_restarted_loop_lag_forgets_a_pause_made_on_purpose() -> None:

    async def run() -> tuple[float, float]:
        lag = LoopLag(interval=0.005)
        lag.start()
        time.sleep(0.1)  # e.g. the heap's one full collection before the first bundle is served
        await asyncio.sleep(0)
        await asyncio.sleep(0.001)
        before = lag.lag()
        lag.restart()
        after = lag.lag()
        lag.stop()
        return before, after

    before, after = asyncio.run(run())
    assert before >= 0.09 and after < 0.005


def test_the_adaptive_limit_follows_the_latency_headroom_and_grows_only_while_it_refuses() -> None:
    from esp_retrieval.service.search.admission import LIMIT_BACKOFF, LIMIT_WINDOW, AdaptiveLimit

    step = LIMIT_WINDOW * 1.01  # a little over a window: no float edge
    limit = AdaptiveLimit(objective=0.02, initial=10, ceiling=64)
    t = 100.0

    def window(latency: float, refused: bool = False) -> int:
        nonlocal t
        if refused:
            limit.refused()
        limit.answered(latency, t)
        t += step
        limit.answered(latency, t)  # the window closes at this answer
        return limit.limit

    assert window(0.022) == int(10 * LIMIT_BACKOFF)  # a little late: the least cut
    assert window(0.08) == 2  # four times the objective: a quarter of the 8 in force
    assert window(0.005) == 2  # on time, but nothing was refused: no reason to grow
    assert window(0.005, refused=True) == 4  # 4x headroom while refusing: doubles at most
    assert window(0.015, refused=True) == 5  # 4 * 20 / 15 = 5.3
    assert window(0.019, refused=True) == 5  # not enough headroom for one more: stays
    for _ in range(10):
        window(0.001, refused=True)
    assert limit.limit == 64  # the ceiling
    for _ in range(30):
        window(1.0)
    assert limit.limit == 1  # never below one


def test_the_adaptive_limit_never_falls_below_its_floor() -> None:
    from esp_retrieval.service.search.admission import LIMIT_WINDOW, AdaptiveLimit

    limit = AdaptiveLimit(objective=0.02, initial=64, ceiling=1024, floor=64)
    t = 100.0
    for _ in range(20):  # every answer 50x late: without the floor the limit would reach 1
        limit.answered(1.0, t)
        t += LIMIT_WINDOW * 1.01
        limit.answered(1.0, t)
    assert limit.limit == 64
    assert AdaptiveLimit(objective=0.02, initial=8, ceiling=16, floor=64).limit == 16  # the ceiling wins


def test_a_search_is_refused_when_the_event_loop_lags_past_the_budget() -> None:
    from esp_retrieval.service.http_limits import RECEIVED
    from esp_retrieval.service.search.admission import AdmissionMiddleware

    lag = LoopLag()
    lag._due = time.monotonic() + 3600  # started, next callback not due: the lag is the last one

    def Batcher() -> FakeBatcher:  # noqa: N802
        return FakeBatcher(lag=lag)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        from esp_retrieval.service.search.wait import ARRIVAL

        arrived.append(scope[ARRIVAL].at)

    arrived: list[float | None] = []

    async def run() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        middleware = AdmissionMiddleware(app, _pipeline(Batcher()))
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/search",
            "headers": [],
            RECEIVED: time.monotonic(),
        }
        await middleware(scope, receive=_body, send=send)  # type: ignore[arg-type]
        return sent

    lag.last = 0.3  # its bytes waited about 300 ms in the socket before the loop read them
    late = asyncio.run(run())
    assert late[0]["status"] == 429 and b"waited about 300 ms" in late[1]["body"]
    lag.last = 0.01
    assert asyncio.run(run()) == []
    assert arrived and arrived[0] is not None and arrived[0] < time.monotonic()  # the search knows it


def _raw(server: Any) -> socket.socket:
    url = urlparse(server.url)
    return socket.create_connection((url.hostname, url.port), timeout=30)


def _head_and_body(s: socket.socket, data: bytes = b"") -> tuple[str, bytes]:
    """One HTTP answer read whole from ``s``, after the ``data`` already received from it."""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(v) for k, _, v in (ln.partition(":") for ln in lines[1:]) if k.lower() == "content-length"
    )
    while len(rest) < length:
        rest += s.recv(65536)
    return head.decode("latin-1"), rest[:length]


@pytest.mark.slow
def test_a_slow_body_holds_no_slot_and_a_trickled_one_meets_its_deadline_on_a_live_server(
    tiny_bundle: Path, server_factory: Any
) -> None:
    # one search in flight at most, a budget no request here comes near: only the limit refuses
    server = server_factory(
        tiny_bundle,
        max_inflight_searches=1,
        latency_budget_ms=600_000,
        search_body_deadline_seconds=2.0,
        body_timeout_seconds=30.0,
    )
    host = urlparse(server.url).netloc
    body = json.dumps({"queries": [{"text": "what is a cat"}], "k": 3}).encode()
    head = (
        f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    ).encode()
    with _raw(server) as slow, _raw(server) as other:
        slow.sendall(head + b"Expect: 100-continue\r\n\r\n")  # its body comes later
        assert slow.recv(65536).startswith(b"HTTP/1.1 100")  # admission is reading its body
        other.sendall(head + b"\r\n" + body)
        answered_head, _ = _head_and_body(other)
        assert answered_head.startswith("HTTP/1.1 200")  # the slow body holds no slot of the limit of 1
        slow.sendall(body)
        slow_head, slow_body = _head_and_body(slow)
        assert slow_head.startswith("HTTP/1.1 200") and len(json.loads(slow_body)["results"]) == 1
    with _raw(server) as trickle:  # one byte a second: never silent for the 30 s body timeout
        trickle.sendall(head + b"\r\n")
        t0 = time.monotonic()
        answer = b""
        for byte in body:
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                break
            trickle.settimeout(1.0)
            try:
                answer += trickle.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        took = time.monotonic() - t0
        trickle.settimeout(30)  # the head and the body may arrive in separate segments
        trickle_head, trickle_body = _head_and_body(trickle, answer)
    assert trickle_head.startswith("HTTP/1.1 408") and b"ESP_SEARCH_BODY_DEADLINE_SECONDS" in trickle_body
    assert took < 10  # its 2 s deadline, not the body's length in seconds (a byte a second)


def test_past_the_inflight_limit_a_search_whose_body_arrived_gets_429_counted_by_reason() -> None:
    from esp_retrieval.service.search.admission import AdmissionMiddleware

    def Batcher() -> FakeBatcher:  # noqa: N802
        return FakeBatcher(latency_budget=600.0, per_request=0.5, idle=True)

    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()  # in flight until released

    async def run() -> tuple[list[dict[str, Any]], Any]:
        pipeline = _pipeline(Batcher(), max_inflight_searches=1)
        middleware = AdmissionMiddleware(app, pipeline)
        scope = {"type": "http", "method": "POST", "path": "/v1/search", "headers": []}
        held = asyncio.create_task(middleware(dict(scope), _body, None))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert middleware.inflight == 1 and pipeline.metrics.admission_inflight._value.get() == 1
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await middleware(dict(scope), _body, send)  # type: ignore[arg-type]
        release.set()
        await held
        assert middleware.inflight == 0
        return sent, pipeline.metrics

    sent, metrics = asyncio.run(run())
    assert sent[0]["status"] == 429 and (b"retry-after", b"1") in sent[0]["headers"]
    assert b"ESP_MAX_INFLIGHT_SEARCHES" in sent[1]["body"]
    assert metrics.admission_refusals.labels(reason="inflight")._value.get() == 1
    assert metrics.admission_refusals.labels(reason="forecast")._value.get() == 0
    assert metrics.admission_limit._value.get() == 1


def test_a_burst_of_one_micro_batch_is_admitted_after_late_answers_shrank_the_limit() -> None:
    """The issue's burst: 64 small searches at once, after a window of late answers (which, without
    the floor of one micro-batch, cut the adaptive limit to 16 and refused 48 of them)."""
    from esp_retrieval.service.search.admission import LIMIT_WINDOW, AdmissionMiddleware
    from esp_retrieval.service.search.wait import ARRIVAL

    release = asyncio.Event()
    late = True

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if late:
            scope[ARRIVAL].at -= 1.0  # answered a second after it arrived: 4x the 250 ms objective
        else:
            await release.wait()  # the burst: in flight together

    async def run() -> list[dict[str, Any]]:
        nonlocal late
        middleware = AdmissionMiddleware(app, _pipeline(FakeBatcher(idle=True)))
        scope = {"type": "http", "method": "POST", "path": "/v1/search", "headers": []}
        for _ in range(2):  # the second late answer, a window later, closes the window
            await middleware(dict(scope), _body, None)  # type: ignore[arg-type]
            await asyncio.sleep(LIMIT_WINDOW * 1.1)
        late = False
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        burst = [
            asyncio.create_task(middleware(dict(scope), _body, send))  # type: ignore[arg-type]
            for _ in range(64)
        ]
        await asyncio.sleep(0.05)
        assert middleware.inflight == 64
        release.set()
        await asyncio.gather(*burst)
        return sent

    assert asyncio.run(run()) == []  # nothing refused: no 429 was sent


def test_an_idle_engine_admits_whatever_the_last_batch_cost() -> None:
    from esp_retrieval.service.search.admission import AdmissionMiddleware

    def Batcher(idle: bool) -> FakeBatcher:  # noqa: N802
        return FakeBatcher(wait_per_query=2.0, idle=idle)  # the last batch cost 2 s a query

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def run(idle: bool) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/search", "headers": []}
        await AdmissionMiddleware(app, _pipeline(Batcher(idle)))(scope, _body, send)  # type: ignore[arg-type]
        return sent

    assert asyncio.run(run(idle=True)) == []  # nothing ahead of it: admitted
    assert asyncio.run(run(idle=False))[0]["status"] == 429


def test_the_loop_lag_monitor_rests_while_no_search_asks_and_resumes_on_one() -> None:

    async def run() -> tuple[bool, bool, float]:
        lag = LoopLag(interval=0.005, idle_after=0.05)
        lag.start()
        await asyncio.sleep(0.2)
        rested = lag.resting  # no touch for 50 ms: it stopped waking the loop
        lag.touch()
        resumed = not lag.resting
        time.sleep(0.05)  # the loop is busy
        await asyncio.sleep(0)
        measured = lag.lag()
        lag.stop()
        return rested, resumed, measured

    rested, resumed, measured = asyncio.run(run())
    assert rested and resumed and measured >= 0.04


def test_the_adaptive_limit_holds_a_search_to_the_objective_per_slice_of_its_queries(tmp_path: Path) -> None:
    from esp_retrieval.service.search.admission import LIMIT_WINDOW, AdaptiveLimit, AdmissionMiddleware
    from esp_retrieval.service.search.wait import ARRIVAL

    state = _state(tmp_path)

    async def sliced() -> int:  # the batcher says how many slices a request was queued as
        b = _batcher(Metrics(), max_batch=64, max_wait_ms=0, queue_size=1000)
        await b.start()
        arrival = Arrival(time.monotonic())
        await b.submit(state, _vectors(130, 0), np.ones(2), 1, arrival=arrival)
        await b.stop()
        return arrival.slices

    assert asyncio.run(sliced()) == 3

    def Batcher() -> FakeBatcher:  # noqa: N802
        return FakeBatcher()

    def answered_in_one_second(slices: int) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            scope[ARRIVAL].slices = slices
            scope[ARRIVAL].at -= 1.0  # as if it had arrived a second ago

        return app

    async def run(slices: int) -> int:
        batcher = Batcher()
        middleware = AdmissionMiddleware(answered_in_one_second(slices), _pipeline(batcher))
        # a limit grown to twice its floor (one micro-batch) earlier, so that it has room to shrink
        middleware.adaptive = AdaptiveLimit(
            batcher.latency_budget, initial=128, ceiling=batcher.queue_size, floor=batcher.max_batch
        )
        scope = {"type": "http", "method": "POST", "path": "/v1/search", "headers": []}
        for _ in range(2):  # the second answer, a window later, closes the window
            await middleware(scope, _body, None)  # type: ignore[arg-type]
            await asyncio.sleep(LIMIT_WINDOW * 1.1)
        assert middleware.adaptive is not None
        return middleware.adaptive.limit

    assert asyncio.run(run(slices=8)) == 128  # 125 ms per slice: on time, the limit stays
    assert 64 <= asyncio.run(run(slices=1)) < 128  # one slice answered in a second: late, it shrinks
