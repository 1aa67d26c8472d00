"""The loop's pool for blocking work: all its threads exist from start-up, and a burst of
blocking calls waits for them instead of starting more (asyncio's own pool grows with the burst)."""

from __future__ import annotations

import asyncio
import threading
import time

from esp_retrieval.service import blocking


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("esp-blocking")}


async def _burst(calls: int) -> tuple[int, set[threading.Thread]]:
    """``calls`` overlapping blocking calls on the default executor: the most threads alive
    during them, and the threads they ran on."""
    seen: list[int] = []
    ran_on: set[threading.Thread] = set()

    def work() -> None:
        time.sleep(0.05)
        seen.append(threading.active_count())
        ran_on.add(threading.current_thread())

    await asyncio.gather(*(asyncio.to_thread(work) for _ in range(calls)))
    return max(seen), ran_on


def test_every_thread_starts_at_install_and_a_burst_adds_none() -> None:
    """Counted by thread, not by the process's total: threads of other tests of the same worker
    (a pool left stopping) may end meanwhile."""

    async def scenario() -> tuple[set[threading.Thread], set[threading.Thread]]:
        earlier = _pool_threads()
        pool = await blocking.install(3)
        started = _pool_threads() - earlier
        _, ran_on = await _burst(20)
        blocking.uninstall(pool)
        return started, ran_on

    started, ran_on = asyncio.run(scenario())
    assert len(started) == 3
    assert ran_on <= started, "the burst ran on the threads started at install"


def test_asyncios_own_pool_grows_with_a_burst() -> None:
    """The drift the fixed pool removes: without it the same burst starts threads as it goes."""

    async def scenario() -> tuple[int, int]:
        before = threading.active_count()
        during, _ = await _burst(20)
        return before, during

    before, during = asyncio.run(scenario())
    assert during > before + 1


def test_after_uninstall_the_loop_still_runs_blocking_work() -> None:
    async def scenario() -> str:
        pool = await blocking.install(2)
        blocking.uninstall(pool)
        return await asyncio.to_thread(lambda: threading.current_thread().name)

    name = asyncio.run(scenario())
    assert not name.startswith("esp-blocking")
