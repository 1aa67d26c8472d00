"""Micro-batching: gather queries of concurrent requests, encode and score them in one engine call.

Requests put a :class:`Job` (their queries, their ``(K,)`` weights, ``k`` and the
:class:`~esp_retrieval.service.state.ServingState` they were validated against) on a bounded queue and
await a future. One consumer task takes jobs for up to ``max_wait_ms`` or until
``max_batch`` queries, then runs :func:`run_batch` on a dedicated worker thread, so the event
loop never blocks on the encoder or the engine. Inside the batch, per-row weights go to the
engine as ``(nq, K)`` (docs/architecture.md section 1: each row's weights scale only that row), ``k`` is
the batch's largest and each job keeps its own first ``k`` (top-k is prefix-stable with
the engine's deterministic tie order). Jobs of different states (a hot reload happened while
they waited) are scored separately, each on its own state: nothing is dropped, nothing mixes.
A state's sparse blocks (``state.sparse``) get their weights per row the same way, and their
query vectors from the rows' texts (:func:`esp_retrieval.service.sparse_query.engine_sparse`).

The gather window is adaptive: the consumer waits for more jobs only when the recent arrivals
say one is due within the window (the median gap between the arrivals of the last 100 ms is
under ``max_wait_ms``). Under load (concurrency 32 on loopback: gaps of tens of microseconds)
it gathers as configured; one closed-loop caller (one request per round trip) or sparse
traffic would only pay the window as latency, so their job goes at once. Jobs that queue
while the worker is busy are always taken together.

The queue is bounded in *queries*: when a request would overflow it, the caller gets 429 with
``Retry-After`` instead of a growing queue (docs/architecture.md section 3). It is also bounded
in *time*: with a ``latency_budget_ms``, a request is refused (429) when the queries ahead of it
and its own would take longer than the budget, once per ``max_batch`` slice of the request (a
search of 256 queries is not late for taking longer than one of a single query; were the budget
the same for both, no large search would be admitted while others run), at the measured engine
cost (a fixed cost per batch plus one
per query, fitted to the recent batches: :mod:`esp_retrieval.service.search.cost`), and ``Retry-After``
is the time that queue needs to drain at the measured rate; so what
is admitted is answered in about the budget instead of waiting seconds behind work that cannot
finish in any useful time. The time the request already waited counts too: since it reached the
server (its :class:`~service.search.admission.Arrival`: its headers' time stamp less the event loop's lag). At
dequeue, a request none of whose slices ran yet and that has waited longer than the budget is
answered 429 instead of being run (Controlled Delay: a forecast that turned out wrong, a reload
that slowed the engine, must not turn into admitted answers seconds late).

Fairness: a request is queued as slices of at most ``max_batch`` queries, and the queue is
round-robin over requests: after one slice of a large request is taken, the request goes to
the back, so a one-query search waits for at most one slice of each request ahead of it.

A request whose client disconnects while its queries wait is dropped from the queue (the
route passes the ASGI ``receive``; a watcher awaits ``http.disconnect``) and answered with
:class:`~esp_retrieval.service.errors.ClientClosedError`; slices already in the engine finish. Each batch
holds its states (:meth:`ServingState.acquire`) while it runs, so a retired engine is closed
only after its last batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from esp_retrieval.service.errors import ClientClosedError, NotReadyError, OverloadedError
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.search.cost import BatchCost, fit_batch_cost
from esp_retrieval.service.search.wait import Arrival, LoopLag
from esp_retrieval.service.sparse_query import columns, engine_sparse
from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.scoring import normalize_blocks

log = logging.getLogger(__name__)

_RECENT_SECONDS = 0.1  # arrivals older than this say nothing about the next one
_RECENT_MAX = 64  # arrival times kept
_RATE_BATCHES = 32  # recent batches the throughput is measured over
_RATE_SECONDS = 5.0  # ... and no older than this
_WATCH_AFTER = 0.05  # seconds a request waits before its disconnect is watched (a task per request costs)
_SIZES = 64  # recent request sizes (queries) the mean request is measured over

Receive = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class QueryInput:
    """One query after validation: a text to encode, or a ``(D,)`` vector with at least one
    non-zero block, as sent (the batch L2-normalises each block: :func:`normalize_blocks`)."""

    text: str | None = None
    vector: np.ndarray | None = None


@dataclass(frozen=True)
class QueryHits:
    """Top hits of one query: ``scores (k,)``, ``rows (k,)`` int64, ``subspace_scores (k, C)``,
    its columns named by ``columns`` (``None``: the layout's ``K`` blocks; with sparse blocks the
    dense blocks and then the sparse ones, :func:`esp_retrieval.service.sparse_query.columns`)."""

    scores: np.ndarray
    rows: np.ndarray
    subspace_scores: np.ndarray
    columns: tuple[str, ...] | None = None


@dataclass(eq=False)
class Request:
    """One submitted request: its result rows and the slices still to answer."""

    future: asyncio.Future[list[QueryHits]]
    size: int
    slices: deque[Job] = field(default_factory=deque)
    results: list[QueryHits | None] = field(default_factory=list)
    open_slices: int = 0
    #: (stage, start ns, end ns, attributes) of its batches, wall clock, when traced (service.tracing)
    stages: list[tuple[str, int, int, dict[str, Any]]] | None = None
    queued_ns: int = 0
    #: ``time.monotonic()`` when it reached the server (its admission ``Arrival``), if known
    arrived: float | None = None
    started: bool = False  # a slice was taken into a batch

    def deliver(self, job: Job, hits: list[QueryHits] | BaseException) -> None:
        """A slice's answer; the request's future resolves with the last one (or the first error)."""
        if self.future.done():
            return
        if isinstance(hits, BaseException):
            self.future.set_exception(hits)
            return
        self.results[job.offset : job.offset + job.size] = hits
        self.open_slices -= 1
        if self.open_slices == 0:
            self.future.set_result(self.results)  # type: ignore[arg-type]


@dataclass(eq=False)
class Job:
    """One slice (at most ``max_batch`` queries) of a :class:`Request`, scored on ``state``."""

    state: ServingState
    queries: Sequence[QueryInput]
    block_weights: np.ndarray
    k: int
    request: Request
    offset: int = 0
    #: ``(S,)`` weights of the state's sparse blocks (``state.sparse`` order); ``None``: all 0
    sparse_weights: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.queries)


def _record_stages(
    requests: Sequence[Request], started_ns: int, encode_ns: tuple[int, int], engine_ns: tuple[int, int],
    attributes: dict[str, Any],
) -> None:
    """The batch's stages into each traced request's ``stages`` (once per request per batch)."""
    for req in dict.fromkeys(requests):  # a request's slices may share a batch
        assert req.stages is not None
        req.stages.append(("esp.search.queue_wait", req.queued_ns, started_ns, {}))
        if encode_ns[1]:
            req.stages.append(("esp.search.encode", *encode_ns, attributes))
        req.stages.append(("esp.search.engine", *engine_ns, attributes))


def _score_group(jobs: Sequence[Job], metrics: Metrics) -> list[list[QueryHits]]:
    """Encode the texts of ``jobs`` (one encoder call) and score all rows in one engine call."""
    state = jobs[0].state
    layout = state.layout
    nq = sum(j.size for j in jobs)
    started_ns = time.time_ns()
    traced = [j.request for j in jobs if j.request.stages is not None]
    queries = np.empty((nq, layout.dim), dtype=np.float32)
    weights = np.empty((nq, len(layout)), dtype=np.float64)
    sparse_names = tuple(state.sparse)
    sparse_weights = np.zeros((nq, len(sparse_names)), dtype=np.float64)
    row_texts: list[str | None] = [None] * nq
    text_rows: list[int] = []
    texts: list[str] = []
    vector_rows: list[int] = []
    vectors: list[np.ndarray] = []
    row = 0
    for job in jobs:
        weights[row : row + job.size] = job.block_weights
        if sparse_names and job.sparse_weights is not None:
            sparse_weights[row : row + job.size] = job.sparse_weights
        for q in job.queries:
            row_texts[row] = q.text
            if q.text is not None:
                text_rows.append(row)
                texts.append(q.text)
            else:
                assert q.vector is not None
                vector_rows.append(row)
                vectors.append(q.vector)
            row += 1
    if vectors:
        # the whole micro-batch at once, off the event loop; prescaled: request values may be huge
        queries[vector_rows] = normalize_blocks(np.stack(vectors, dtype=np.float64), layout, prescale=True)
    encode_ns = (0, 0)
    if texts:
        t0 = time.perf_counter()
        encode_ns = (time.time_ns(), 0)
        queries[text_rows] = state.encode(texts)
        encode_ns = (encode_ns[0], time.time_ns())
        metrics.encode_duration.observe(time.perf_counter() - t0)
    k = max(j.k for j in jobs)
    # Rank is invariant to scaling a row's weights: score with max weight 1 so tiny (or large)
    # weights cannot underflow (overflow) the engine's float32 scan, then scale the scores back.
    peak = np.maximum(weights.max(axis=1, keepdims=True),
                      sparse_weights.max(axis=1, keepdims=True, initial=0.0))
    sparse = engine_sparse(state.sparse, row_texts, sparse_weights / peak)
    t0 = time.perf_counter()
    engine_start_ns = time.time_ns()
    res = state.search(queries, weights / peak, k, sparse=sparse)
    metrics.engine_duration.labels(backend=state.engine.name).observe(time.perf_counter() - t0)
    if traced:
        _record_stages(traced, started_ns, encode_ns, (engine_start_ns, time.time_ns()),
                       {"esp.batch_size": nq, "esp.texts": len(texts), "esp.backend": state.engine.name})
    metrics.batch_size.observe(nq)
    out: list[list[QueryHits]] = []
    row = 0
    for job in jobs:
        hits = []
        # a job that weighs no sparse block reports the dense columns only, however it was batched
        names = columns(layout, sparse_names, sparse_weights[row]) if sparse is not None else layout.names
        for r in range(row, row + job.size):
            hits.append(
                QueryHits(
                    scores=res.scores[r, : job.k].astype(np.float64) * peak[r, 0],
                    rows=res.rows[r, : job.k],
                    subspace_scores=res.subspace_scores[r, : job.k, : len(names)],
                    columns=names,
                )
            )
        out.append(hits)
        row += job.size
    return out


def run_batch(jobs: Sequence[Job], metrics: Metrics) -> list[list[QueryHits] | BaseException]:
    """Score a micro-batch; runs on the worker thread. A failure fails only its state's jobs."""
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(id(job.state), []).append(i)
    out: list[list[QueryHits] | BaseException] = [RuntimeError("not scored")] * len(jobs)
    for idx in groups.values():
        try:
            results = _score_group([jobs[i] for i in idx], metrics)
        except Exception as exc:  # answered as 500 to these jobs only; the batcher keeps running
            log.exception("micro-batch of %d jobs failed", len(idx))
            for i in idx:
                out[i] = exc
            continue
        for i, res in zip(idx, results, strict=True):
            out[i] = res
    return out


class MicroBatcher:
    """Bounded queue + one consumer task + one worker thread. Start and stop in the lifespan."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        max_batch: int,
        max_wait_ms: float,
        queue_size: int,
        gather: bool = True,
        latency_budget_ms: float | None = None,
    ) -> None:
        self.metrics = metrics
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.queue_size = queue_size
        self.gather = gather
        self.latency_budget = latency_budget_ms / 1000.0 if latency_budget_ms is not None else None
        self._queue: deque[Request] = deque()
        self._depth = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._inflight: list[Job] = []
        self._inflight_since = 0.0
        self._arrivals: deque[float] = deque(maxlen=_RECENT_MAX)
        self._batches: deque[tuple[float, int, float]] = deque(maxlen=_RATE_BATCHES)  # (end, nq, seconds)
        self._rate: tuple[float, float | None] | None = None  # (valid until, seconds per query), cached
        self._cost: tuple[float, BatchCost | None] | None = None  # (valid until, batch cost), cached
        self._fit: BatchCost | None = None  # the last batch cost fitted (its slope outlives its window)
        self._sizes: deque[int] = deque(maxlen=_SIZES)
        self.lag = LoopLag()  # the event loop's lag (service.search.wait), started with the batcher
        self.dropped = 0  # queries dropped because their client went away
        self.shed = 0  # requests answered 429 at dequeue: they had waited past the budget
        metrics.queue_capacity.set(queue_size)
        metrics.queue_depth.set(0)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in the engine: the next query starts at once."""
        return self._depth == 0 and not self._inflight

    @property
    def depth(self) -> int:
        """Queries waiting (not yet taken into a batch)."""
        return self._depth

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="esp-engine")
        self._task = asyncio.create_task(self._run(), name="esp-micro-batcher")
        self.lag.start()

    def seconds_per_query(self, now: float | None = None) -> float | None:
        """Engine seconds per query over the recent batches (``None`` before any was measured).

        Asked several times per request, so the figure is kept until a batch ends or the oldest
        batch it counts ages out of the window.
        """
        now = time.monotonic() if now is None else now
        if self._rate is not None and now < self._rate[0]:
            return self._rate[1]
        recent = [(end, n, dt) for end, n, dt in self._batches if now - end <= _RATE_SECONDS]
        queries = sum(n for _, n, _ in recent)
        value = sum(dt for _, _, dt in recent) / queries if queries else None
        self._rate = (recent[0][0] + _RATE_SECONDS if recent else math.inf, value)
        return value

    def seconds_per_request(self, now: float | None = None) -> float | None:
        """Engine seconds per request: :meth:`seconds_per_query` times the mean size of the recent
        requests (``None`` before any was measured)."""
        spq = self.seconds_per_query(now)
        if spq is None or not self._sizes:
            return None
        return spq * sum(self._sizes) / len(self._sizes)

    def batch_cost(self, now: float | None = None) -> BatchCost | None:
        """The engine's cost per batch, fitted to the recent batches
        (:func:`esp_retrieval.service.search.cost.fit_batch_cost`; ``None`` before any was measured); kept
        until a batch ends, as :meth:`seconds_per_query`."""
        now = time.monotonic() if now is None else now
        if self._cost is not None and now < self._cost[0]:
            return self._cost[1]
        recent = [(end, n, dt) for end, n, dt in self._batches if now - end <= _RATE_SECONDS]
        fit = fit_batch_cost(((n, dt) for _, n, dt in recent), self._fit)
        if fit is not None:
            self._fit = fit
        self._cost = (recent[0][0] + _RATE_SECONDS if recent else math.inf, fit)
        return fit

    def expected_wait(self, n: int, now: float | None = None) -> float:
        """Seconds until ``n`` more queries would be answered (0 before any batch was measured):
        the rest of the batch in the engine, then the queue ahead of them and their own, in
        batches of at most ``max_batch`` queries (one per request slice without gathering),
        each charged its fixed cost once and each query its own (:meth:`batch_cost`)."""
        now = time.monotonic() if now is None else now
        cost = self.batch_cost(now)
        if cost is None:
            return 0.0
        inflight = sum(j.size for j in self._inflight)
        left = max(0.0, cost(inflight) - (now - self._inflight_since)) if inflight else 0.0
        queued = self._depth + n
        batches = math.ceil(queued / self.max_batch) if self.gather else len(self._queue) + 1
        return left + cost.queue(queued, batches)

    def _admit(self, n: int, arrived: float | None) -> None:
        if self._depth + n > self.queue_size:
            spq = self.seconds_per_query()
            self.metrics.child(self.metrics.admission_refusals, "queue_full").inc()
            raise OverloadedError(
                f"overloaded: {self._depth} queries are waiting and the queue holds "
                f"{self.queue_size}; retry later",
                retry_after=max(1.0, (self._depth * spq) if spq else 1.0),
            )
        if self.latency_budget is None or self.idle:
            return  # an idle engine takes the request at once, whatever it costs
        now = time.monotonic()
        wait = self.expected_wait(n, now)
        waited = now - arrived if arrived is not None else 0.0
        # each batch-sized slice has the budget: a search of 256 queries is not late for taking
        # longer than a search of one (else no large search is ever admitted while others run)
        slices = math.ceil(n / self.max_batch)
        if waited + wait > self.latency_budget * slices:
            self.metrics.queue_depth.set(self._depth)
            self.metrics.child(self.metrics.admission_refusals, "forecast").inc()
            per = f" per {self.max_batch} queries ({slices} slices)" if slices > 1 else ""
            raise OverloadedError(
                f"overloaded: the {self._depth} queries ahead would take about {wait * 1000:.0f} ms at the "
                f"measured throughput after {waited * 1000:.0f} ms waited, over the latency budget of "
                f"{self.latency_budget * 1000:.0f} ms{per} (setting ESP_LATENCY_BUDGET_MS); retry later",
                retry_after=wait,
            )

    async def submit(
        self,
        state: ServingState,
        queries: Sequence[QueryInput],
        block_weights: np.ndarray,
        k: int,
        receive: Receive | None = None,
        *,
        stages: list[tuple[str, int, int, dict[str, Any]]] | None = None,
        arrival: Arrival | None = None,
        sparse_weights: np.ndarray | None = None,
    ) -> list[QueryHits]:
        """Queue the queries; return one :class:`QueryHits` per query, in order.

        Raises :class:`OverloadedError` (429, Retry-After) when the queue cannot take them or
        they would wait longer than the latency budget, :class:`NotReadyError` (503) once the
        batcher is stopping, and :class:`ClientClosedError` when ``receive`` (the request's
        ASGI receive) reports a disconnect while they wait. ``stages``: a list that receives the
        wall-clock times of queue wait, encode and engine of the batches that serve these
        queries (:mod:`esp_retrieval.service.tracing`), or None. ``arrival``: when the request reached the
        server (:class:`esp_retrieval.service.search.admission.Arrival`, made by the admission middleware);
        its wait since counts against the budget, and it learns how many slices it was queued as.
        ``sparse_weights``: ``(S,)`` weights of ``state.sparse``'s blocks (``None``: 0;
        :mod:`esp_retrieval.service.sparse_query`).
        """
        if self._closed or self._task is None:
            raise NotReadyError("the service is shutting down")
        n = len(queries)
        arrived = arrival.at if arrival is not None else None
        self._admit(n, arrived)
        self._sizes.append(n)
        waits = bool(self._queue or self._inflight)
        loop = asyncio.get_running_loop()
        req = Request(
            loop.create_future(), n, results=[None] * n, stages=stages, queued_ns=time.time_ns(),
            arrived=arrived,
        )
        step = self.max_batch
        for off in range(0, n, step):
            req.slices.append(
                Job(state, queries[off : off + step], block_weights, k, req, off, sparse_weights)
            )
        req.open_slices = len(req.slices)
        if arrival is not None:  # for the admission middleware's measure of this request
            arrival.slices = req.open_slices
        self._queue.append(req)
        self._arrivals.append(time.monotonic())
        self._depth += n
        self.metrics.queue_depth.set(self._depth)
        self._wakeup.set()
        if receive is None or not waits:
            return await req.future
        # Most waits end within a batch or two: only a request still waiting after _WATCH_AFTER
        # gets a task that listens for its client's disconnect.
        watcher: asyncio.Task[None] | None = None

        def watch() -> None:
            nonlocal watcher
            watcher = loop.create_task(self._watch(req, receive))

        timer = loop.call_later(_WATCH_AFTER, watch)
        try:
            return await req.future
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()

    async def _watch(self, req: Request, receive: Receive) -> None:
        """Drop ``req``'s waiting slices when its client disconnects."""
        while not req.future.done():
            message = await receive()
            if message.get("type") == "http.disconnect":
                self.abandon(req)
                return

    def abandon(self, req: Request) -> None:
        """The client is gone: its slices still queued are dropped, the request answered with
        :class:`ClientClosedError` (slices in the engine finish and are discarded)."""
        waiting = sum(j.size for j in req.slices)
        if waiting:
            req.slices.clear()
            with contextlib.suppress(ValueError):
                self._queue.remove(req)
            self._depth -= waiting
            self.dropped += waiting
            self.metrics.queue_depth.set(self._depth)
        if not req.future.done():
            req.future.set_exception(ClientClosedError("the client closed the connection before the answer"))

    async def _wait_for_job(self, timeout: float | None) -> bool:
        self._wakeup.clear()
        if self._queue:
            return True
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def worth_waiting(self, now: float) -> bool:
        """Whether another job is due within the window: median recent arrival gap < max_wait."""
        recent = [t for t in self._arrivals if now - t <= _RECENT_SECONDS]
        if len(recent) < 2:
            return False
        return statistics.median(b - a for a, b in itertools.pairwise(recent)) < self.max_wait

    def _pop_slice(self) -> Job:
        """The next slice, round-robin: a request with slices left goes to the back."""
        req = self._queue.popleft()
        req.started = True
        job = req.slices.popleft()
        if req.slices:
            self._queue.append(req)
        return job

    def _shed_late(self) -> None:
        """Answer 429 to the requests at the head of the queue that waited past the budget since
        they arrived and have not started: run now, they could only be answered late."""
        if self.latency_budget is None:
            return
        now = time.monotonic()
        while self._queue:
            req = self._queue[0]
            if req.started or req.arrived is None or now - req.arrived <= self.latency_budget:
                return
            self._queue.popleft()
            waiting = sum(j.size for j in req.slices)
            req.slices.clear()
            self._depth -= waiting
            self.shed += 1
            self.metrics.queue_depth.set(self._depth)
            self.metrics.child(self.metrics.admission_refusals, "shed").inc()
            if not req.future.done():
                spq = self.seconds_per_query(now)
                req.future.set_exception(OverloadedError(
                    f"overloaded: this request waited {(now - req.arrived) * 1000:.0f} ms before the engine "
                    f"could take it, over the latency budget of {self.latency_budget * 1000:.0f} ms "
                    "(setting ESP_LATENCY_BUDGET_MS); retry later",
                    retry_after=self._depth * spq if spq else 1.0,
                ))

    async def _take_batch(self) -> list[Job]:
        self._shed_late()
        while not self._queue:
            await self._wait_for_job(None)
            self._shed_late()
        batch = [self._pop_slice()]
        size = batch[0].size
        if self.gather:
            now = time.monotonic()
            deadline = now + (self.max_wait if self.worth_waiting(now) else 0.0)
            while size < self.max_batch:
                self._shed_late()
                if not self._queue:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not await self._wait_for_job(remaining):
                        break
                    continue
                if size + self._queue[0].slices[0].size > self.max_batch:
                    break
                job = self._pop_slice()
                batch.append(job)
                size += job.size
        self._depth -= size
        self.metrics.queue_depth.set(self._depth)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._take_batch()
            self._inflight = batch
            self._inflight_since = time.monotonic()
            states = {id(j.state): j.state for j in batch}
            held = [s for s in states.values() if s.acquire()]  # a retired engine outlives this batch
            closed = {id(s) for s in states.values()} - {id(s) for s in held}
            runnable = [j for j in batch if id(j.state) not in closed]
            results: list[list[QueryHits] | BaseException] = []
            try:
                if runnable:
                    results = await loop.run_in_executor(self._executor, run_batch, runnable, self.metrics)
            except Exception as exc:  # the executor itself failed; answer, keep serving
                log.exception("micro-batch worker failed")
                results = [exc] * len(runnable)
            finally:
                for s in held:
                    s.release()
            end = time.monotonic()
            nq = sum(j.size for j in runnable)
            if nq:
                self._batches.append((end, nq, end - self._inflight_since))
                self._rate = self._cost = None
            answers = dict(zip(map(id, runnable), results, strict=True))
            for job in batch:
                res = answers.get(id(job), NotReadyError("the bundle was replaced; retry", retry_after=1.0))
                job.request.deliver(job, res)
            self._inflight = []

    async def stop(self, drain_seconds: float = 10.0) -> None:
        """Refuse new work, let queued jobs finish (bounded), then stop the task and thread."""
        self._closed = True
        self.lag.stop()
        deadline = time.monotonic() + drain_seconds
        while (self._queue or self._inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        left = [j.request for j in self._inflight] + list(self._queue)
        self._queue.clear()
        self._inflight = []
        for req in left:
            req.slices.clear()
            if not req.future.done():
                req.future.set_exception(NotReadyError("the service is shutting down"))
        self._depth = 0
        self.metrics.queue_depth.set(0)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
