"""The event loop's pool for blocking work, fixed in size and started whole (docs/architecture.md).

``asyncio.to_thread`` and ``run_in_executor(None, ...)`` (registry checks, rollout polls, result
building, upserts, query encoding, clustering) run on the loop's default executor. asyncio's own
starts a thread only when a call finds none idle, so the thread count of a serving process drifts
up with the most blocking calls that ever overlapped (a rollout poll during a registry check) and an
operator watching it cannot tell growth from a leak. This pool has ``size`` threads from start-up
to shutdown: the count is flat by construction, and a burst of blocking work waits for a thread
instead of adding one.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor


def default_size() -> int:
    """asyncio's own bound for its default executor: ``min(32, cores + 4)``."""
    return min(32, (os.cpu_count() or 1) + 4)


async def install(size: int | None = None) -> ThreadPoolExecutor:
    """Make a pool of ``size`` threads (default :func:`default_size`), all started, the running
    loop's default executor; :func:`uninstall` it at shutdown."""
    size = size if size is not None else default_size()
    pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="esp-blocking")
    # ``size`` tasks that all wait for each other run on ``size`` distinct threads, so every
    # thread exists once they return (the pool never starts more, and never stops one early).
    barrier = threading.Barrier(size)
    await asyncio.gather(*(asyncio.wrap_future(pool.submit(barrier.wait, 30.0)) for _ in range(size)))
    asyncio.get_running_loop().set_default_executor(pool)
    return pool


def uninstall(pool: ThreadPoolExecutor) -> None:
    """Stop ``pool`` once its running work ends, and give the loop a lazily started pool like
    asyncio's own, so anything the loop still runs after the app keeps working."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
    pool.shutdown(wait=False)
