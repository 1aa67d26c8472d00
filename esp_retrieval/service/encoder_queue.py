"""Requests queued on a bundle's encoder thread, bounded in number and in time (``/v1/embeddings``).

The encoder thread (:meth:`esp_retrieval.service.state.ServingState.encoder_job`) runs one job at a time, so
without a bound requests pile up behind a long one: each waits as long as all before it take,
and holds its texts meanwhile. :class:`EncoderQueue` admits at most ``limit`` jobs at once
(waiting or encoding); one more is refused at once with :class:`~esp_retrieval.service.errors.OverloadedError`
(429, ``Retry-After``). Every admitted job is answered within ``deadline`` seconds:

- still waiting for the encoder then: taken off the queue, never run, answered 429
  (``Retry-After``), like a search shed at dequeue;
- encoding then: answered 503 with ``Retry-After`` the deadline (a request this large does not
  fit it now), as ``/v1/cluster`` does; the job stops at its next ``check()`` and keeps its place
  in the count until it has.

A caller that goes away (its task cancelled) has its job dropped the same way. The event loop is
the only thread that counts, so the count needs no lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from esp_retrieval.service.errors import NotReadyError, OverloadedError
from esp_retrieval.service.state import ServingState

T = TypeVar("T")

#: seconds a refused request is told to wait: the encoder serves a queued job in about that
RETRY_AFTER = 1.0


class DeadlinePassedError(Exception):
    """Raised by a job's ``check()`` once its request was answered without it (deadline, caller gone)."""


class EncoderQueue:
    """At most ``limit`` jobs on the encoder at once, each answered within ``deadline`` seconds.

    ``limit_setting`` and ``deadline_setting`` name the settings in the refusals' messages.
    """

    def __init__(self, limit: int, deadline: float, limit_setting: str, deadline_setting: str) -> None:
        self.limit, self.deadline = limit, deadline
        self._limit_setting, self._deadline_setting = limit_setting, deadline_setting
        self.admitted = 0  # jobs queued or running (until their thread is done with them)

    async def run(self, state: ServingState, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args, check)`` on ``state``'s encoder thread; ``fn`` calls ``check()`` between its
        steps, which raises :class:`DeadlinePassedError` once the request was answered without it."""
        if self.admitted >= self.limit:
            raise OverloadedError(
                f"{self.admitted} requests are queued for the encoder, at most {self.limit} "
                f"(setting {self._limit_setting}): retry shortly",
                retry_after=RETRY_AFTER,
            )
        deadline = time.monotonic() + self.deadline
        given_up = threading.Event()

        def check() -> None:
            if given_up.is_set() or time.monotonic() > deadline:
                raise DeadlinePassedError

        future = state.encoder_job(fn, *args, check)
        self.admitted += 1
        job = asyncio.wrap_future(future)
        job.add_done_callback(self._finished)
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.deadline)
        except (TimeoutError, DeadlinePassedError):
            given_up.set()
            if future.cancel():  # it never reached the encoder
                raise OverloadedError(
                    f"waited {self.deadline:g} s for the encoder without reaching it "
                    f"(setting {self._deadline_setting}): retry shortly",
                    retry_after=RETRY_AFTER,
                ) from None
            raise NotReadyError(
                f"not encoded within {self.deadline:g} s (setting {self._deadline_setting}): "
                "send fewer or shorter texts per request, or retry later",
                "input",
                retry_after=self.deadline,
            ) from None
        except asyncio.CancelledError:  # the caller went away: its work is not done for nobody
            given_up.set()
            future.cancel()
            raise

    def _finished(self, job: asyncio.Future[Any]) -> None:
        """The thread is done with the job (or it was taken off the queue): its place is free."""
        self.admitted -= 1
        if not job.cancelled():
            job.exception()  # retrieved: an abandoned job's error is not an unhandled one
