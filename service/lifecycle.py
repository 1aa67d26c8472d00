"""Load a bundle beside the served one, then swap it in: the initial load and every hot reload.

:func:`load_and_activate` runs :func:`service.state.load_state` (read, checksums, engine,
encoder, warm-up) on a worker thread, checks that the operating-point registry still fits the
new layout, then, in one step on the event loop: hands the bundle to the registry watcher,
swaps the state reference, and updates the bundle metrics. Any failure before the swap leaves
the served state untouched and is raised as :class:`~service.errors.ReloadRefusedError`
(409) with the reason. Reloads are serialised by the holder's lock.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from service.config import Settings
from service.errors import ReloadRefusedError
from service.metrics import Metrics
from service.state import ServingState, StateHolder, load_state

log = logging.getLogger(__name__)


def publish_bundle_metrics(metrics: Metrics, state: ServingState) -> None:
    metrics.bundle_info.clear()
    metrics.bundle_info.labels(version=state.version, dtype=state.dtype, backend=state.engine.name).set(1)
    metrics.index_documents.set(state.num_docs)
    metrics.ready.set(1)


def _load_checked(path: Path, settings: Settings, registry: Any, check_registry: bool) -> ServingState:
    state = load_state(path, settings)
    if check_registry and registry is not None:
        registry.check_bundle(state.bundle)  # RegistryError when the file does not fit the new layout
    return state


async def load_and_activate(
    app_state: Any, path: Path, settings: Settings, *, check_registry: bool = True
) -> tuple[ServingState | None, ServingState]:
    """Load ``path`` beside the served bundle and swap it in; return ``(old, new)``.

    ``app_state`` is ``app.state`` (holder, metrics, registry). Raises
    :class:`ReloadRefusedError` and counts ``esp_bundle_reloads_total{result="failure"}`` when the new
    bundle is refused; the served one is kept.
    """
    holder: StateHolder = app_state.holder
    metrics: Metrics = app_state.metrics
    registry = getattr(app_state, "registry", None)
    async with holder.reload_lock:
        old = holder.current
        try:
            new = await asyncio.to_thread(_load_checked, path, settings, registry, check_registry)
        except Exception as exc:
            metrics.bundle_reloads.labels(result="failure").inc()
            kept = f"still serving bundle {old.version}" if old is not None else "no bundle is served"
            reason = f"{type(exc).__name__}: {exc}"
            log.error("bundle at %s refused (%s): %s", path, kept, reason)
            if old is None:
                holder.error = f"bundle at {path} refused: {reason}"
            raise ReloadRefusedError(f"bundle at {path} refused ({kept}): {reason}") from None
        if registry is not None:
            registry.set_bundle(new.bundle)
        holder.swap(new)
        publish_bundle_metrics(metrics, new)
        metrics.bundle_reloads.labels(result="success").inc()
        log.info("serving bundle %s (was %s)", new.version, old.version if old is not None else "none")
        return old, new
