"""What admission can see of a search's wait beyond the micro-batcher's queue.

Admission keys on the served latency objective, ``ESP_LATENCY_BUDGET_MS``: a search is refused
(429, ``Retry-After``) when its answer would come later than that. The micro-batcher forecasts
the engine's share (:meth:`service.search.batching.MicroBatcher.expected_wait`); two more parts of a
request's wait happen where the batcher cannot see them, and this module measures them:

- the event loop's lag (:class:`~esp_retrieval.service.search.wait.LoopLag`): bytes a client sent wait in the
  socket until the loop reads them; while the loop is busy (a burst to parse, a reload holding
  the interpreter) that wait is about the lag, and the request's own time stamp (when its
  headers were parsed, :data:`service.http_limits.RECEIVED`) misses it. The admission check adds it.
- the search's :class:`~esp_retrieval.service.search.wait.Arrival`: its headers' stamp minus the lag, made by
  :class:`AdmissionMiddleware` and handed to the route in the request's scope, which passes it
  to the micro-batcher, so the batcher can shed, at dequeue, a request that has already waited
  out the budget (Controlled Delay: work that can only be late is answered 429 instead of run).

And it bounds the searches in progress: :class:`AdaptiveLimit`, an in-flight limit adapted to the
objective from the latency the server measures of the searches it answers (AIMD, as TCP's window
or Netflix's concurrency-limits), or the fixed ``ESP_MAX_INFLIGHT_SEARCHES``. A forecast sees the
engine's queue; the measured latency also sees what no forecast models: the event loop's hops
between parsing, the batch and the answer, and an engine that shares its core with them.

:class:`AdmissionMiddleware` applies all of it before a search's body is read. Its parts reach it
explicitly: the :class:`esp_retrieval.service.search.pipeline.SearchPipeline` it is built with.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from esp_retrieval.service.errors import ErrorKind, encoded_error, send_error
from esp_retrieval.service.http_limits import ADMITTED_AT_HEAD, RECEIVED, EarlyAnswer
from esp_retrieval.service.logs import request_id_from
from esp_retrieval.service.search.wait import ARRIVAL, Arrival, LoopLag

if TYPE_CHECKING:
    from esp_retrieval.service.search.batching import MicroBatcher
    from esp_retrieval.service.search.pipeline import SearchPipeline

#: (reason, message, Retry-After seconds): reason is one of esp_retrieval.service.metrics.REFUSAL_REASONS
Refusal = tuple[str, str, float]

#: The adaptive limit's window (seconds): it changes at most once per window.
LIMIT_WINDOW = 0.1
#: The least it shrinks by after a window in which a search answered later than the objective.
LIMIT_BACKOFF = 0.8


class AdaptiveLimit:
    """Searches that may be in progress at once, adapted to the latency objective (a gradient
    limit, as Netflix's concurrency-limits or Envoy's adaptive concurrency).

    Over each window of :data:`LIMIT_WINDOW` seconds the slowest answer ``m`` (from a search's
    estimated arrival to its answer, per batch-sized slice of its queries: a search of 256
    queries is not late for taking longer than a search of one) is kept; at the window's end,
    with ``L`` the limit in force and ``objective / m`` the headroom (latency grows about in
    proportion to the searches in progress, so ``L * objective / m`` is the most that would still
    be on time):

    - some answer was late (``m > objective``): the limit shrinks to that, and by at least
      :data:`LIMIT_BACKOFF`, never below ``floor``;
    - none was, and the limit refused a search in the window: it grows to that, at most doubling
      and up to ``ceiling``; the fractional part carries over, so a limit with too little headroom
      for one more stays where it is.

    So it settles where the server still answers within the objective, and moves when the
    engine's speed or the load changes (a reload, a neighbour on the core). The service's floor
    is one micro-batch (``ESP_MAX_BATCH``): the searches one engine call serves together cost
    about what one costs, so a burst that size at an idle server is never refused, and one slow
    search cannot shut the door on the rest. Deterministic given the calls: time is passed in.
    """

    def __init__(self, objective: float, initial: int, ceiling: int, floor: int = 1) -> None:
        self.objective = objective
        self.ceiling = max(1, ceiling)
        self.floor = min(max(1, floor), self.ceiling)
        self._limit = float(min(max(self.floor, initial), self.ceiling))
        self._window_start: float | None = None
        self._slowest = 0.0
        self._refused = False

    @property
    def limit(self) -> int:
        return max(1, int(self._limit))

    def refused(self) -> None:
        """The limit refused a search: more would have come."""
        self._refused = True

    def answered(self, latency: float, now: float) -> None:
        """A search admitted under the limit was answered after ``latency`` seconds."""
        if self._window_start is None:
            self._window_start = now
        self._slowest = max(self._slowest, latency)
        if now - self._window_start < LIMIT_WINDOW:
            return
        in_force = self.limit
        fits = in_force * self.objective / max(self._slowest, 1e-9)  # on time at this many, roughly
        if self._slowest > self.objective:
            self._limit = max(float(self.floor), min(self._limit * LIMIT_BACKOFF, fits))
        elif self._refused:
            self._limit = min(float(self.ceiling), max(self._limit, min(2.0 * in_force, fits)))
        self._window_start, self._slowest, self._refused = now, 0.0, False


class AdmissionMiddleware:
    """Every early refusal of ``POST /v1/search``, in two steps around reading its body.

    1. At its headers, before the body is read (the cheap way to refuse, so a saturated event
       loop sheds load instead of reading work it will refuse; under ``esp serve`` the HTTP
       protocol has already asked :class:`HeadAdmission` the same, more cheaply, and this step is
       skipped for the searches it let through): refused (reason ``forecast``) when
       the event loop's lag (:class:`~esp_retrieval.service.search.wait.LoopLag`: about how long its bytes
       waited in the socket), plus the time since its headers were complete (the scope stamp of
       :mod:`esp_retrieval.service.http_limits`), plus the micro-batcher's expected wait for one more query
       (:meth:`esp_retrieval.service.search.batching.MicroBatcher.expected_wait`) exceed the budget. An idle
       engine admits whatever the last batch cost.
    2. The body is read whole, within ``ESP_SEARCH_BODY_DEADLINE_SECONDS`` of the headers (408
       otherwise, however steadily it trickles), and only then does the search count as in flight:
       a slow client holds its own connection, never a slot. Refused (reason ``inflight``) when the
       searches in flight reach the limit: ``ESP_MAX_INFLIGHT_SEARCHES`` when set, else adapted to
       the latency objective from the latency measured of the searches answered
       (:class:`AdaptiveLimit`).

    ``Retry-After`` is the queue's (or the in-flight searches') drain time at the measured rate,
    at least 1 s. Each refusal counts in ``esp_admission_refusals_total{reason}``; the in-flight
    count and the limit are gauges. An admitted search carries its estimated arrival (its
    :class:`~esp_retrieval.service.search.wait.Arrival`, in the scope under :data:`ARRIVAL`), so the
    micro-batcher can refuse it when queued (``queue_full``, ``forecast``) or shed it at dequeue
    (``shed``) if it waits out the budget.

    ``pipeline``: the search wing's parts; its batcher is None before start-up (nothing to admit
    against yet: every request passes).
    """

    def __init__(self, app: ASGIApp, pipeline: SearchPipeline, path: str = "/v1/search") -> None:
        self.app = app
        self.pipeline = pipeline
        self.path = path
        self.inflight = 0  # searches whose body arrived, admitted here and not yet answered
        self.adaptive: AdaptiveLimit | None = None  # made at the first search (it needs the budget)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.path):
            await self.app(scope, receive, send)
            return
        batcher = self.pipeline.batcher
        if batcher is None:
            await self.app(scope, receive, send)
            return
        metrics = self.pipeline.metrics
        now = time.monotonic()
        received = scope.get(RECEIVED)
        lag = batcher.lag
        lag.touch()
        late = lag.lag(now)
        metrics.loop_lag.observe(late)
        arrival = Arrival((received if isinstance(received, float) else now) - late)
        refusal = None if scope.get(ADMITTED_AT_HEAD) else forecast_refusal(batcher, now, now - arrival.at)
        if refusal is None:
            body = await self._read_body(receive, lag, arrival)
            if body is None:
                deadline = self.pipeline.settings.search_body_deadline_seconds
                message = (f"the search body was not complete within {deadline:g} s of its headers "
                           "(setting ESP_SEARCH_BODY_DEADLINE_SECONDS)")
                await send_error(send, ErrorKind.REQUEST_TIMEOUT, message, close=True)
                return
            refusal = self._inflight_refusal(batcher, time.monotonic())
        if refusal is not None:
            metrics.child(metrics.admission_refusals, refusal[0]).inc()
            kind, message, extra = refusal_answer(refusal)
            await send_error(send, kind, message, headers=extra)
            return
        self.inflight += 1
        metrics.admission_inflight.set(self.inflight)
        scope[ARRIVAL] = arrival

        async def replay() -> Message:
            return body.pop(0) if body else await receive()  # then the disconnect, if it comes

        try:
            await self.app(scope, replay, send)
        finally:
            done = time.monotonic()
            if self.adaptive is not None:
                self.adaptive.answered((done - arrival.at) / arrival.slices, done)
            self.inflight -= 1
            metrics.admission_inflight.set(self.inflight)

    async def _read_body(self, receive: Receive, lag: LoopLag, arrival: Arrival) -> list[Message] | None:
        """The body's messages, read within the deadline (None past it). The time spent waiting
        for the client's bytes is the client's, not a wait for the server: it moves the arrival
        on (a body sent with its headers costs nothing). A disconnect ends the body early: the
        app then reads it and answers nobody."""
        messages: list[Message] = []

        async def read() -> None:
            while True:
                t0 = time.monotonic()
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    return
                for_client = time.monotonic() - t0 - lag.lag()  # what the loop's own lag does not explain
                if for_client > 0:
                    arrival.at += for_client
                if not message.get("more_body", False):
                    return

        try:
            async with asyncio.timeout(self.pipeline.settings.search_body_deadline_seconds):  # no extra task
                await read()
        except TimeoutError:
            return None
        return messages

    def _limit(self, batcher: MicroBatcher) -> tuple[int | None, str]:
        """The in-flight limit now, and what sets it."""
        fixed = self.pipeline.settings.max_inflight_searches
        if fixed is not None:
            return fixed, "the limit ESP_MAX_INFLIGHT_SEARCHES"
        budget = batcher.latency_budget
        if budget is None:
            return None, ""
        if self.adaptive is None:
            self.adaptive = AdaptiveLimit(
                budget, initial=batcher.max_batch, ceiling=batcher.queue_size, floor=batcher.max_batch
            )
        return self.adaptive.limit, (
            f"the most the server answers within the latency budget of {budget * 1000:.0f} ms now "
            "(adapted to the latency measured; setting ESP_LATENCY_BUDGET_MS)"
        )

    def _inflight_refusal(self, batcher: MicroBatcher, now: float) -> Refusal | None:
        limit, how = self._limit(batcher)
        if limit is not None:
            self.pipeline.metrics.admission_limit.set(limit)
        if limit is None or self.inflight < limit:
            return None
        if self.adaptive is not None:
            self.adaptive.refused()
        per_request = batcher.seconds_per_request(now)
        message = f"overloaded: {self.inflight} searches are in progress, {how}; retry later"
        return "inflight", message, self.inflight * per_request if per_request else 1.0


def forecast_refusal(batcher: MicroBatcher, now: float, waited: float) -> Refusal | None:
    """Refused (``forecast``) when ``waited`` (the request's wait for the server so far) plus the
    micro-batcher's expected wait for one more query exceed the latency budget; an idle engine
    admits whatever the last batch cost."""
    budget = batcher.latency_budget
    if budget is None or batcher.idle:
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
    return "forecast", message, max(ahead, waited)


def refusal_answer(refusal: Refusal) -> tuple[ErrorKind, str, list[tuple[bytes, bytes]]]:
    """A refusal's error kind (429), message and ``Retry-After`` (whole seconds, at least 1)."""
    _, message, retry_after = refusal
    return ErrorKind.OVERLOADED, message, [(b"retry-after", str(max(1, math.ceil(retry_after))).encode())]


class HeadAdmission:
    """The forecast refusal of :class:`AdmissionMiddleware`, made by the HTTP protocol at a
    search's headers (:class:`esp_retrieval.service.http_limits.LimitedHttpToolsProtocol`), before any request
    object, task or middleware exists for it: a refusal there costs the parse and one write, where
    one made by the middleware costs an ASGI task through the middleware stack (a server refusing
    every search, on one core: 34 us a refusal here, 71 us in the middleware).

    Called with the request's method, target and header fields and when its headers were
    complete; returns the 429 to write (and counts it: ``esp_admission_refusals_total{reason}``,
    ``esp_requests_total{route,status}``, the loop-lag histogram), or None to let the request
    through (the middleware then skips its own forecast check; the in-flight limit and the
    batcher's checks still apply). Installed through the app's lifespan state
    (:data:`esp_retrieval.service.http_limits.HEAD_ADMISSION`).
    """

    def __init__(self, pipeline: SearchPipeline, path: str = "/v1/search") -> None:
        self.pipeline = pipeline
        self.path = path
        self.target = path.encode("ascii")

    def __call__(
        self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], received: float
    ) -> EarlyAnswer | None:
        if method != b"POST" or target.partition(b"?")[0] != self.target:
            return None
        batcher = self.pipeline.batcher
        if batcher is None:
            return None
        now = time.monotonic()
        lag = batcher.lag
        lag.touch()
        late = lag.lag(now)
        refusal = forecast_refusal(batcher, now, now - received + late)
        if refusal is None:
            return None
        metrics = self.pipeline.metrics
        metrics.loop_lag.observe(late)
        metrics.child(metrics.admission_refusals, refusal[0]).inc()
        metrics.child(metrics.requests, self.path, "429").inc()
        kind, message, extra = refusal_answer(refusal)
        caller_id = next((value for name, value in headers if name == b"x-request-id"), None)
        extra.append((b"x-request-id", request_id_from(caller_id).encode("ascii")))
        return encoded_error(kind, message, headers=extra)
