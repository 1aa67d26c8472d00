"""Micro-batching: gather queries of concurrent requests, encode and score them in one engine call.

Requests put a :class:`Job` (their queries, their ``(K,)`` weights, ``k`` and the
:class:`~service.state.ServingState` they were validated against) on a bounded queue and
await a future. One consumer task takes jobs for up to ``max_wait_ms`` or until
``max_batch`` queries, then runs :func:`run_batch` on a dedicated worker thread, so the event
loop never blocks on the encoder or the engine. Inside the batch, per-row weights go to the
engine as ``(nq, K)`` (docs/architecture.md section 1: each row's weights scale only that row), ``k`` is
the batch's largest and each job keeps its own first ``k`` (top-k is prefix-stable with
the engine's deterministic tie order). Jobs of different states (a hot reload happened while
they waited) are scored separately, each on its own state: nothing is dropped, nothing mixes.

The gather window is adaptive: the consumer waits for more jobs only when the recent arrivals
say one is due within the window (the median gap between the arrivals of the last 100 ms is
under ``max_wait_ms``). Under load (concurrency 32 on loopback: gaps of tens of microseconds)
it gathers as configured; one closed-loop caller (one request per round trip) or sparse
traffic would only pay the window as latency, so their job goes at once. Jobs that queue
while the worker is busy are always taken together.

The queue is bounded in *queries*: when a request would overflow it, the caller gets 429 with
``Retry-After`` instead of a growing queue (docs/architecture.md section 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from service.errors import NotReadyError, OverloadedError
from service.metrics import Metrics
from service.state import ServingState
from subspace.scoring import normalize_blocks

log = logging.getLogger(__name__)

_RECENT_SECONDS = 0.1  # arrivals older than this say nothing about the next one
_RECENT_MAX = 64  # arrival times kept


@dataclass(frozen=True)
class QueryInput:
    """One query after validation: a text to encode, or a ``(D,)`` vector with at least one
    non-zero block, as sent (the batch L2-normalises each block: :func:`normalize_blocks`)."""

    text: str | None = None
    vector: np.ndarray | None = None


@dataclass(frozen=True)
class QueryHits:
    """Top hits of one query: ``scores (k,)``, ``rows (k,)`` int64, ``subspace_scores (k, K)``."""

    scores: np.ndarray
    rows: np.ndarray
    subspace_scores: np.ndarray


@dataclass(eq=False)
class Job:
    state: ServingState
    queries: Sequence[QueryInput]
    block_weights: np.ndarray
    k: int
    future: asyncio.Future[list[QueryHits]]

    @property
    def size(self) -> int:
        return len(self.queries)


def _score_group(jobs: Sequence[Job], metrics: Metrics) -> list[list[QueryHits]]:
    """Encode the texts of ``jobs`` (one encoder call) and score all rows in one engine call."""
    state = jobs[0].state
    layout = state.layout
    nq = sum(j.size for j in jobs)
    queries = np.empty((nq, layout.dim), dtype=np.float32)
    weights = np.empty((nq, len(layout)), dtype=np.float64)
    text_rows: list[int] = []
    texts: list[str] = []
    vector_rows: list[int] = []
    vectors: list[np.ndarray] = []
    row = 0
    for job in jobs:
        weights[row : row + job.size] = job.block_weights
        for q in job.queries:
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
    if texts:
        t0 = time.perf_counter()
        queries[text_rows] = state.encode(texts)
        metrics.encode_duration.observe(time.perf_counter() - t0)
    k = max(j.k for j in jobs)
    # Rank is invariant to scaling a row's weights: score with max weight 1 so tiny (or large)
    # weights cannot underflow (overflow) the engine's float32 scan, then scale the scores back.
    peak = weights.max(axis=1, keepdims=True)
    t0 = time.perf_counter()
    res = state.search(queries, weights / peak, k)
    metrics.engine_duration.labels(backend=state.engine.name).observe(time.perf_counter() - t0)
    metrics.batch_size.observe(nq)
    out: list[list[QueryHits]] = []
    row = 0
    for job in jobs:
        hits = []
        for r in range(row, row + job.size):
            hits.append(
                QueryHits(
                    scores=res.scores[r, : job.k].astype(np.float64) * peak[r, 0],
                    rows=res.rows[r, : job.k],
                    subspace_scores=res.subspace_scores[r, : job.k],
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
    ) -> None:
        self.metrics = metrics
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.queue_size = queue_size
        self.gather = gather
        self._queue: deque[Job] = deque()
        self._depth = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._inflight: list[Job] = []
        self._arrivals: deque[float] = deque(maxlen=_RECENT_MAX)
        metrics.queue_capacity.set(queue_size)
        metrics.queue_depth.set(0)

    @property
    def depth(self) -> int:
        """Queries waiting (not yet taken into a batch)."""
        return self._depth

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="esp-engine")
        self._task = asyncio.create_task(self._run(), name="esp-micro-batcher")

    async def submit(
        self, state: ServingState, queries: Sequence[QueryInput], block_weights: np.ndarray, k: int
    ) -> list[QueryHits]:
        """Queue the queries; return one :class:`QueryHits` per query, in order.

        Raises :class:`OverloadedError` (429, Retry-After) when the queue cannot take them and
        :class:`NotReadyError` (503) once the batcher is stopping.
        """
        if self._closed or self._task is None:
            raise NotReadyError("the service is shutting down")
        n = len(queries)
        if self._depth + n > self.queue_size:
            raise OverloadedError(
                f"overloaded: {self._depth} queries are waiting and the queue holds "
                f"{self.queue_size}; retry later",
                retry_after=1.0,
            )
        future: asyncio.Future[list[QueryHits]] = asyncio.get_running_loop().create_future()
        self._queue.append(Job(state, queries, block_weights, k, future))
        self._arrivals.append(time.monotonic())
        self._depth += n
        self.metrics.queue_depth.set(self._depth)
        self._wakeup.set()
        return await future

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

    async def _take_batch(self) -> list[Job]:
        while not self._queue:
            await self._wait_for_job(None)
        batch = [self._queue.popleft()]
        size = batch[0].size
        if self.gather:
            now = time.monotonic()
            deadline = now + (self.max_wait if self.worth_waiting(now) else 0.0)
            while size < self.max_batch:
                if not self._queue:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not await self._wait_for_job(remaining):
                        break
                    continue
                if size + self._queue[0].size > self.max_batch:
                    break
                job = self._queue.popleft()
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
            try:
                results = await loop.run_in_executor(self._executor, run_batch, batch, self.metrics)
            except Exception as exc:  # the executor itself failed; answer, keep serving
                log.exception("micro-batch worker failed")
                results = [exc] * len(batch)
            for job, res in zip(batch, results, strict=True):
                if job.future.done():  # the caller went away
                    continue
                if isinstance(res, BaseException):
                    job.future.set_exception(res)
                else:
                    job.future.set_result(res)
            self._inflight = []

    async def stop(self, drain_seconds: float = 10.0) -> None:
        """Refuse new work, let queued jobs finish (bounded), then stop the task and thread."""
        self._closed = True
        deadline = time.monotonic() + drain_seconds
        while (self._queue or self._inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        left = [*self._inflight, *self._queue]
        self._queue.clear()
        self._inflight = []
        for job in left:
            if not job.future.done():
                job.future.set_exception(NotReadyError("the service is shutting down"))
        self._depth = 0
        self.metrics.queue_depth.set(0)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
