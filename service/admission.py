"""What admission can see of a search's wait beyond the micro-batcher's queue.

Admission keys on the served latency objective, ``ESP_LATENCY_BUDGET_MS``: a search is refused
(429, ``Retry-After``) when its answer would come later than that. The micro-batcher forecasts
the engine's share (:meth:`service.batching.MicroBatcher.expected_wait`); two more parts of a
request's wait happen where the batcher cannot see them, and this module measures them:

- :class:`LoopLag`, the event loop's lag: how late a callback due every :data:`LAG_INTERVAL`
  seconds runs. Bytes a client sent wait in the socket until the loop reads them; while the loop
  is busy (a burst to parse, a reload holding the interpreter) that wait is about the lag, and
  the server sees nothing of it in the request itself (its time stamp starts when its headers
  are parsed, :data:`service.http_limits.RECEIVED`). The admission check adds it.
- :data:`ARRIVED`: the estimated arrival time of the request being served (its headers' time
  stamp minus the lag), set by :class:`service.middleware.AdmissionMiddleware` for the request's
  task, so the micro-batcher can shed, at dequeue, a request that has already waited out the
  budget (Controlled Delay: work that can only be late is answered 429 instead of being run).

And it bounds the searches in progress: :class:`AdaptiveLimit`, an in-flight limit adapted to the
objective from the latency the server measures of the searches it answers (AIMD, as TCP's window
or Netflix's concurrency-limits), or the fixed ``ESP_MAX_INFLIGHT_SEARCHES``. A forecast sees the
engine's queue; the measured latency also sees what no forecast models: the event loop's hops
between parsing, the batch and the answer, and an engine that shares its core with them.
"""

from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar

#: Seconds between the lag monitor's callbacks (the resolution of the lag it reports).
LAG_INTERVAL = 0.005

#: ``time.monotonic()`` when the search being served reached the server (estimated), or None.
ARRIVED: ContextVar[float | None] = ContextVar("esp_arrived", default=None)
#: The batch-sized slices the search being served was queued as (the micro-batcher sets it):
#: the adaptive limit holds a search of ``s`` slices to ``s`` times the objective.
SLICES: ContextVar[int] = ContextVar("esp_slices", default=1)


class LoopLag:
    """Event-loop lag: how late a callback scheduled every ``interval`` s runs.

    :meth:`lag` is the lateness of the last callback, or, while the next one is overdue (the
    loop is busy right now), how overdue it is, whichever is larger. Time is read with
    ``time.monotonic()`` (uvloop's ``loop.time()`` does not advance within one loop iteration).
    Start and stop on the loop it measures.
    """

    def __init__(self, interval: float = LAG_INTERVAL) -> None:
        self.interval = interval
        self.last = 0.0
        self._due: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = time.monotonic() + self.interval
        self._handle = self._loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        if self._due is not None:
            self.last = max(0.0, time.monotonic() - self._due)
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._due = None

    def restart(self) -> None:
        """Forget the lateness measured so far (a pause made on purpose, before serving)."""
        self.stop()
        self.last = 0.0
        self.start()

    def lag(self, now: float | None = None) -> float:
        """Seconds the loop is behind (0 when not started)."""
        if self._due is None:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(self.last, now - self._due)


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
      :data:`LIMIT_BACKOFF` (never below 1);
    - none was, and the limit refused a search in the window: it grows to that, at most doubling
      and up to ``ceiling``; the fractional part carries over, so a limit with too little headroom
      for one more stays where it is.

    So it settles where the server still answers within the objective, and moves when the
    engine's speed or the load changes (a reload, a neighbour on the core). Deterministic given
    the calls: time is passed in.
    """

    def __init__(self, objective: float, initial: int, ceiling: int) -> None:
        self.objective = objective
        self.ceiling = max(1, ceiling)
        self._limit = float(min(max(1, initial), self.ceiling))
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
            self._limit = max(1.0, min(self._limit * LIMIT_BACKOFF, fits))
        elif self._refused:
            self._limit = min(float(self.ceiling), max(self._limit, min(2.0 * in_force, fits)))
        self._window_start, self._slowest, self._refused = now, 0.0, False
