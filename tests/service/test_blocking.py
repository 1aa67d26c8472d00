"""The loop's pool for blocking work: all its threads exist from start-up, and a burst of
blocking calls waits for them instead of starting more (asyncio's own pool grows with the burst)."""

from __future__ import annotations

import asyncio
import threading
import time

from esp_retrieval.service import blocking


def _pool_threads() -> int:
    return sum(t.name.startswith("esp-blocking") for t in threading.enumerate())


async def _burst(calls: int) -> int:
    """``calls`` overlapping blocking calls on the default executor; the threads alive during them."""
    seen: list[int] = []

    def work() -> None:
        time.sleep(0.05)
        seen.append(threading.active_count())

    await asyncio.gather(*(asyncio.to_thread(work) for _ in range(calls)))
    return max(seen)


def test_every_thread_starts_at_install_and_a_burst_adds_none() -> None:
    async def scenario() -> tuple[int, int, int, int]:
        earlier = _pool_threads()  # a pool another test of this worker left stopping
        pool = await blocking.install(3)
        started, before = _pool_threads() - earlier, threading.active_count()
        during = await _burst(20)
        blocking.uninstall(pool)
        return started, before, during, threading.active_count()

    started, before, during, _ = asyncio.run(scenario())
    assert started == 3
    assert during == before, "the burst ran on the threads started at install"


def test_asyncios_own_pool_grows_with_a_burst() -> None:
    """The drift the fixed pool removes: without it the same burst starts threads as it goes."""

    async def scenario() -> tuple[int, int]:
        before = threading.active_count()
        return before, await _burst(20)

    before, during = asyncio.run(scenario())
    assert during > before + 1


def test_after_uninstall_the_loop_still_runs_blocking_work() -> None:
    async def scenario() -> str:
        pool = await blocking.install(2)
        blocking.uninstall(pool)
        return await asyncio.to_thread(lambda: threading.current_thread().name)

    name = asyncio.run(scenario())
    assert not name.startswith("esp-blocking")
