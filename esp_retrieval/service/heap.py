"""Keep the cyclic garbage collector off the heap that lives as long as the served bundle.

Nearly all of a server's objects live as long as the process or the bundle: modules (torch and
transformers when the bundle has an encoder), the app, the bundle's encoder and documents.
CPython's full collection (generation 2) walks every one of them, and under load it runs every
few seconds, because each request's objects outlive the young collections while the request
waits for its batch; each such pause delays every request in flight (it was the p99 of
``bench/http_load.py`` at concurrency 32). :func:`gc.freeze` moves every object alive now to a
permanent generation that collections skip (Python docs, ``gc.freeze``).

The heap is *settled* (collected once, then frozen) when the first bundle has loaded, before
the server reports ready: the full collection it costs (the longest pause the collector makes:
with the demo's encoder, torch brings some 400,000 objects) is paid while no search waits.
Later bundles are not frozen: settling again would stall a serving process's searches as long,
and what a reload adds (one encoder, one engine) is small beside the start-up heap. Frozen
objects are still freed by reference counting when the first bundle is retired; only a
reference cycle among them would stay for the life of the process (a test checks that a
retired first bundle is freed).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def settle() -> None:
    """Collect everything collectable now, then freeze what is left (see the module docstring)."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.info(
        "heap settled: %d objects frozen, out of the collector's way (%.0f ms)",
        gc.get_freeze_count(), (time.perf_counter() - started) * 1000,
    )
