"""What a search waited before the engine: the event loop's lag and the search's arrival.

- :class:`LoopLag`: how late a callback due every :data:`LAG_INTERVAL` seconds runs. Bytes a
  client sent wait in the socket until the loop reads them; while the loop is busy that wait is
  about the lag, and the request's own time stamp (:data:`esp_retrieval.service.http_limits.RECEIVED`, when
  its headers were parsed) misses it.
- :class:`Arrival`: one admitted search's estimated arrival, made by the admission middleware
  (:mod:`esp_retrieval.service.search.admission`), carried in the request's scope under :data:`ARRIVAL` and
  passed by the route to the micro-batcher, which counts the wait since against the budget.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

#: Seconds between the lag monitor's callbacks (the resolution of the lag it reports).
LAG_INTERVAL = 0.005
#: Seconds without a search after which the lag monitor stops waking the loop.
IDLE_AFTER = 1.0

#: Scope key: the admitted search's :class:`Arrival`.
ARRIVAL = "esp.arrival"


@dataclass(slots=True)
class Arrival:
    """One admitted search: ``at``, ``time.monotonic()`` when it reached the server (estimated:
    its headers' stamp less the loop's lag, moved on by the time its client took to send the
    body), and ``slices``, the batch-sized slices the micro-batcher queued it as (it sets them):
    the adaptive limit holds a search of ``s`` slices to ``s`` times the objective."""

    at: float
    slices: int = 1


class LoopLag:
    """Event-loop lag: how late a callback scheduled every ``interval`` s runs.

    :meth:`lag` is the lateness of the last callback, or, while the next one is overdue (the
    loop is busy right now), how overdue it is, whichever is larger. Time is read with
    ``time.monotonic()`` (uvloop's ``loop.time()`` does not advance within one loop iteration).
    Start and stop on the loop it measures.

    It rests while nothing asks for it: :meth:`touch` (each search) keeps it ticking, and
    after ``idle_after`` seconds without one it stops waking the loop (an idle server would
    otherwise wake every ``interval``), reporting 0 until the next touch resumes it.
    """

    def __init__(self, interval: float = LAG_INTERVAL, idle_after: float = IDLE_AFTER) -> None:
        self.interval = interval
        self.idle_after = idle_after
        self.last = 0.0
        self._due: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._touched = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._touched = time.monotonic()
        self._schedule()

    @property
    def resting(self) -> bool:
        """Started, but not ticking: nothing asked for the lag for ``idle_after`` seconds."""
        return self._loop is not None and self._handle is None

    def touch(self) -> None:
        """Someone will ask for the lag: tick (again, if resting)."""
        self._touched = time.monotonic()
        if self.resting:
            self.last = 0.0
            self._schedule()

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = time.monotonic() + self.interval
        self._handle = self._loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        if self._due is not None:
            self.last = max(0.0, now - self._due)
        if now - self._touched > self.idle_after:
            self._handle = self._due = None  # rest: nothing to measure for
            return
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._due = None
        self._loop = None

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
