"""A background poll loop: an asyncio task that calls a check every few seconds until stopped.

The registry watcher (:mod:`esp_retrieval.service.tuning.watcher`) and the bundle rollout
(:mod:`esp_retrieval.service.rollout`) both poll the registry file this way. An exception in one check is
logged and the loop goes on; :meth:`Poller.stop` cancels the task and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Poller:
    """Calls ``check`` every ``seconds`` (given to :meth:`start`) in a task named ``name``.

    ``check_first``: the first check runs at once (else after one interval). ``what`` names the
    check in the log line of a failed one.
    """

    def __init__(
        self, name: str, check: Callable[[], Awaitable[object]], *, what: str, check_first: bool
    ) -> None:
        self.name = name
        self.what = what
        self._check = check
        self._check_first = check_first
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, seconds: float) -> None:
        """Start polling, unless a poll task is already running."""
        if not self.running:
            self._task = asyncio.create_task(self._run(seconds), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, seconds: float) -> None:
        if not self._check_first:
            await asyncio.sleep(seconds)
        while True:
            try:
                await self._check()
            except Exception:  # the loop must outlive any single bad poll
                log.exception("%s failed", self.what)
            await asyncio.sleep(seconds)
