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

The in-flight limit (``ESP_MAX_INFLIGHT_SEARCHES``, or from Little's law: the budget over the
measured engine seconds per request) is the middleware's; :func:`inflight_limit` computes it.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextvars import ContextVar

#: Seconds between the lag monitor's callbacks (the resolution of the lag it reports).
LAG_INTERVAL = 0.005

#: ``time.monotonic()`` when the search being served reached the server (estimated), or None.
ARRIVED: ContextVar[float | None] = ContextVar("esp_arrived", default=None)


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

    def lag(self, now: float | None = None) -> float:
        """Seconds the loop is behind (0 when not started)."""
        if self._due is None:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(self.last, now - self._due)


def inflight_limit(fixed: int | None, budget: float | None, seconds_per_request: float | None) -> int | None:
    """Searches that may be in progress at once: ``fixed`` when set, else Little's law (requests
    the engine finishes within ``budget`` at its measured ``seconds_per_request``; at least 1),
    else None (no limit: no budget, or nothing measured yet)."""
    if fixed is not None:
        return fixed
    if budget is None or not seconds_per_request:
        return None
    return max(1, math.floor(budget / seconds_per_request))
