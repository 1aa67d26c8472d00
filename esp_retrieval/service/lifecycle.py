"""Load a bundle beside the served one, then swap it in: the initial load and every hot reload.

:func:`load_and_activate` runs :func:`esp_retrieval.service.state.load_state` (read, checksums, engine,
encoder, warm-up) on a worker thread, checks that the operating-point registry still fits the
new layout, then, in one step on the event loop: hands the bundle to the registry watcher,
swaps the state reference, and updates the bundle metrics. Any failure before the swap leaves
the served state untouched and is raised as :class:`~esp_retrieval.service.errors.ReloadRefusedError`
(409) with the reason. Reloads are serialised by the holder's lock. After the swap the old
state is retired: its engine closes once the requests that hold it have been answered
(:meth:`esp_retrieval.service.state.ServingState.retire`).

A bundle without a query encoder replacing one with an encoder is refused (every text query
would fail) unless ``ESP_ALLOW_NO_ENCODER`` says vectors-only serving is intended. Paths and
reasons are logged quoted (``%r``), so a newline in a request's ``path`` cannot forge log lines.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from esp_retrieval.service import heap
from esp_retrieval.service.bundle_roots import BundleRootError, check_bundle_source
from esp_retrieval.service.config import Settings
from esp_retrieval.service.errors import ReloadRefusedError
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.remote_bundle import fetch_bundle, is_uri, prune_cache
from esp_retrieval.service.search.pipeline import SearchPipeline
from esp_retrieval.service.state import ServingState, StateHolder, load_state
from esp_retrieval.subspace.bundle import ENCODER, BundleError, read_manifest

log = logging.getLogger(__name__)
T = TypeVar("T")


def publish_bundle_metrics(metrics: Metrics, state: ServingState) -> None:
    metrics.bundle_info.clear()
    metrics.bundle_info.labels(version=state.version, dtype=state.dtype, backend=state.engine.name).set(1)
    metrics.index_documents.set(state.num_docs)
    metrics.ready.set(1)


def check_encoder_kept(path: Path, served: ServingState | None, settings: Settings) -> None:
    """Refuse an encoder-less bundle in place of one that has an encoder, unless allowed."""
    if served is None or served.encoder is None or settings.allow_no_encoder:
        return
    if not (Path(path) / ENCODER).is_dir():
        raise BundleError(
            f"{ENCODER}/: the bundle has no query encoder but the served bundle {served.version} has one, "
            "so every text query would fail; set ESP_ALLOW_NO_ENCODER=true to serve vector queries only"
        )


def _served_from_cache(source: Path | str, served: ServingState | None, settings: Settings) -> bool:
    """Whether ``source`` is the folder the served bundle was fetched into (a reload without a
    path of a bundle from a URI): its URI was checked against the bundle roots when it was."""
    return (served is not None and not is_uri(source) and Path(source) == served.bundle.path
            and served.bundle.path.parent == Path(settings.bundle_cache))


def _load_checked(
    source: Path | str, settings: Settings, registry: Any, check_registry: bool, served: ServingState | None,
    *, sha256: str | None = None, field: str = "path",
) -> ServingState:
    if not _served_from_cache(source, served, settings):  # a fetched bundle's URI was checked
        source = check_bundle_source(source, settings.allowed_roots, field)  # before anything is read
    path = fetch_bundle(source, sha256, settings.bundle_cache) if is_uri(source) else Path(source)
    read_manifest(path)  # a path that is no bundle is named as such first
    check_encoder_kept(path, served, settings)
    state = load_state(path, settings)
    if check_registry and registry is not None:
        registry.check_bundle(state.bundle)  # RegistryError when the file does not fit the new layout
    return state


#: Every load runs on this one thread (loads are serialised anyway). What a load leaves with the
#: thread that ran it (its malloc arena, the libraries' per-thread buffers) then stays once: on
#: the pool for blocking work, each of its threads kept its own, and RSS climbed by a step per
#: reload (24,884 x 384 numpy bundle: ~25 MB) until every pool thread had loaded once.
_LOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="esp-loader")


async def _on_loader_thread(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread`` on :data:`_LOADER`: ``fn(*args)`` in the caller's context (its
    request id is on the load's log lines)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_LOADER, call)


async def load_and_activate(
    app_state: Any, path: Path | str, settings: Settings, *, sha256: str | None = None,
    check_registry: bool = True, field: str = "path",
) -> tuple[ServingState | None, ServingState]:
    """Load ``path`` beside the served bundle and swap it in; return ``(old, new)``.

    ``path`` is a local directory or a URI (:mod:`esp_retrieval.service.remote_bundle`: fetched into
    ``settings.bundle_cache`` and checked against ``sha256``, the digest of its manifest, on the
    loader thread before anything is loaded; after a swap the cache keeps the new and the old
    bundle only). A bundle outside ``ESP_BUNDLE_ROOTS`` is refused before anything is read
    (:mod:`esp_retrieval.service.bundle_roots`; ``field`` names where it was given). ``app_state`` is
    ``app.state`` (holder, metrics, the search pipeline). Raises
    :class:`ReloadRefusedError` and counts ``esp_bundle_reloads_total{result="failure"}`` when the new
    bundle is refused; the served one is kept.
    """
    holder: StateHolder = app_state.holder
    metrics: Metrics = app_state.metrics
    pipeline: SearchPipeline = app_state.search
    registry = pipeline.registry
    async with holder.reload_lock:
        old = holder.current
        try:
            load = functools.partial(_load_checked, sha256=sha256, field=field)
            new = await _on_loader_thread(load, path, settings, registry, check_registry, old)
        except Exception as exc:
            metrics.bundle_reloads.labels(result="failure").inc()
            kept = f"still serving bundle {old.version}" if old is not None else "no bundle is served"
            reason = f"{type(exc).__name__}: {exc}"
            log.error("bundle at %r refused (%s): %r", str(path), kept, reason)
            if old is None:
                holder.error = f"bundle at {path} refused: {reason}"
            field_at = exc.field if isinstance(exc, BundleRootError) else None
            raise ReloadRefusedError(f"bundle at {path} refused ({kept}): {reason}", field_at) from None
        if old is None:  # the first bundle, before it is served: the start-up heap is complete
            heap.settle()
            if pipeline.batcher is not None:  # that pause was made before serving: no lag to refuse for
                pipeline.batcher.lag.restart()
        if registry is not None:
            registry.set_bundle(new.bundle)
        holder.swap(new)
        if old is not None and old is not new:
            old.retire()  # closed now, or when the last request holding it is answered
        publish_bundle_metrics(metrics, new)
        metrics.bundle_reloads.labels(result="success").inc()
        if is_uri(path):  # the cache keeps what is served and what was
            await _on_loader_thread(prune_cache, settings.bundle_cache,
                                    [s.bundle.path for s in (new, old) if s is not None])
        log.info("serving bundle %s (was %s)", new.version, old.version if old is not None else "none")
        return old, new
