"""Keep the served registry in step with its file, and with the served bundle's layout.

In Kubernetes the registry is a mounted ConfigMap. The kubelet updates it atomically: it
writes a new timestamped directory, then renames a ``..data`` symlink onto it; the file we
were given (``registry.yaml -> ..data/registry.yaml``) never changes as a symlink. So a
change is detected by the file's **resolved real path and content hash** (sha256), read on
every poll (registry files are a few KB). mtime and size are not trusted: a swap can keep
both (the kubelet copies files), and coarse filesystems round mtimes.

On a change the file is parsed and validated against the current layout. Success swaps the
new :class:`Registry` in (one reference assignment: a query sees the old or the new one,
never a mix) and counts ``esp_registry_reloads_total{result="success"}``; failure keeps the
old one, logs why and counts ``result="failure"`` once per distinct bad content (not once
per poll). A registry path that does not exist at start is logged and the service runs on
the bundle's operating points only: an operator expects the service to come up, and the
file is picked up as soon as it appears. A file that disappears later keeps the last good
registry (counted as one failure).

Bundle swaps change the layout. The registry then follows, in this order: the file as it is
now, else the last good file content (the registry in service), else the bundle's own
operating points. :meth:`RegistryWatcher.check_bundle` answers beforehand whether the first
or second fits, so a bundle reload can refuse a bundle the registry does not fit; trying the
file as it is now too means a registry edited for the *next* layout (rejected until then)
does not block the bundle that needs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.polling import Poller
from esp_retrieval.service.tuning.errors import RegistryError
from esp_retrieval.service.tuning.loader import decode
from esp_retrieval.service.tuning.model import Registry
from esp_retrieval.subspace.bundle import Bundle
from esp_retrieval.subspace.layout import SubspaceLayout

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (real path, sha256 of the content)
_MISSING: Key = ("<missing>", "")


class RegistryWatcher:
    """Owns the current :class:`Registry`; ``check_now`` re-reads, ``start`` polls in the background.

    ``app.state.registry`` in the service. Thread-safe: polls run in a worker thread while
    bundle swaps call :meth:`set_bundle` on the event loop.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, metrics: Metrics, poll_seconds: float = 2.0
    ) -> None:
        if poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
        self.path = Path(path) if path is not None else None
        self.poll_seconds = float(poll_seconds)
        self._metrics = metrics
        self._lock = threading.Lock()
        self._current = Registry.empty()
        self._layout: SubspaceLayout | None = None
        self._bundle_points: dict[str, Any] = {}
        self._seen: Key | None = None  # the file content last acted on (installed or rejected)
        self._good: tuple[Key, Any] | None = None  # (key, parsed document) of the registry in service
        self._poller = Poller(
            "esp-registry-watcher", self._check_in_thread, what="registry check", check_first=False
        )
        #: The last rejection's message (None after a file was installed), for logs and debugging.
        self.last_error: str | None = None
        #: ``time.time()`` of the last installed registry.
        self.loaded_at: float | None = None

    @property
    def current(self) -> Registry:
        return self._current

    # --- bundle -----------------------------------------------------------------------------
    def check_bundle(self, bundle: Bundle) -> Registry:
        """Validate the registry against ``bundle`` (layout and manifest points); install nothing.

        Passes when the file as it is now, or the registry in service, fits the bundle (or,
        with no file, when the bundle's own operating points are valid). Call it before a
        bundle swap; raises :class:`RegistryError` naming what does not fit.
        """
        errors: list[str] = []
        docs: list[tuple[str, Any]] = []
        key: Key | None = None
        if self.path is not None:
            try:
                key, raw = self._read(retries=3)
                docs.append((str(self.path), decode(raw, str(self.path))))
            except (FileNotFoundError, InterruptedError):
                pass
            except RegistryError as exc:
                errors.append(exc.message)
            good = self._good
            if good is not None and (not docs or good[0] != key):
                docs.append((f"{self.path} (the registry in service)", good[1]))
        if not docs and not errors:
            docs.append(("bundle", None))
        for source, doc in docs:
            try:
                return Registry.parse(doc, bundle.weight_layout, bundle.operating_points, source=source)
            except RegistryError as exc:
                errors.append(exc.message)
        raise RegistryError("registry does not fit the bundle: " + "; ".join(errors))

    def set_bundle(self, bundle: Bundle) -> None:
        """Adopt the layout and manifest operating points of a newly served bundle.

        Never raises for registry problems (the bundle is already served): it installs the best
        registry that fits (see the module docstring) and logs and counts what did not. Weights
        are keyed by the bundle's weight layout: its blocks and its sparse blocks.
        """
        self.set_layout(bundle.weight_layout, bundle.operating_points)

    def set_layout(self, layout: SubspaceLayout, bundle_points: Mapping[str, Any] | None = None) -> None:
        """:meth:`set_bundle` for a layout without a bundle (tests, tools)."""
        with self._lock:
            self._layout = layout
            self._bundle_points = dict(bundle_points or {})
            if self.path is not None and self._reload(force=True):
                return
            # The registry in service, unless that is the content that just failed.
            if self._good is not None and self._from_file() and self._good[0] != self._seen:
                try:
                    registry = Registry.parse(self._good[1], layout, self._bundle_points,
                                              source=str(self.path))
                except RegistryError as exc:
                    self._reject(f"the registry in service does not fit the new layout: {exc.message}")
                else:
                    self._install(registry, "the registry in service, re-validated for the new layout")
                    return
            try:
                fallback = Registry.parse(None, layout, self._bundle_points)
            except RegistryError as exc:
                self._reject(f"bundle operating points rejected, serving none: {exc.message}")
                fallback = Registry.empty(layout)
            self._good = None
            self._install(fallback, "bundle operating points only")

    # --- the file ---------------------------------------------------------------------------
    def check_now(self) -> bool:
        """Re-read the file if it changed; returns whether a new registry was installed."""
        if self._layout is None:
            return False  # nothing to validate against until a bundle is set
        with self._lock:
            return self._reload(force=False)

    def _read(self, retries: int = 1) -> tuple[Key, bytes]:
        """``((real path, sha256), content)``. Raises FileNotFoundError, RegistryError
        (unreadable), or InterruptedError when a ``..data`` swap raced every attempt."""
        assert self.path is not None
        for _ in range(retries):
            try:
                before = os.path.realpath(self.path)
                raw = self.path.read_bytes()
                after = os.path.realpath(self.path)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise RegistryError(
                    f"{self.path}: cannot read the registry file: {exc.strerror or exc}"
                ) from None
            if before == after:
                return (after, hashlib.sha256(raw).hexdigest()), raw
        raise InterruptedError(f"{self.path} changed while being read")

    def _reload(self, *, force: bool) -> bool:  # noqa: PLR0911 - one return per outcome
        """Install the file if it changed (or, with ``force``, if it fits a new layout).

        Caller holds the lock and has set a layout. A content already rejected is not counted
        again, even when ``force`` re-validates it against a new layout and it fails again.
        """
        assert self._layout is not None
        if self.path is None:
            return False
        try:
            key, raw = self._read(retries=3 if force else 1)
        except InterruptedError:
            return False  # a swap raced the read: the next poll sees the new file
        except FileNotFoundError:
            if self._seen != _MISSING:
                self._seen = _MISSING
                if self._from_file():
                    self._reject(f"{self.path}: the registry file disappeared; keeping the last good one")
                else:
                    log.warning("registry file %s not found: serving the bundle's operating points only",
                                self.path)
            return False
        except RegistryError as exc:
            key = ("<unreadable>", exc.message)
            if self._seen != key:
                self._seen = key
                self._reject(exc.message)
            return False
        if not force and key == self._seen:
            return False
        repeat = key == self._seen and (self._good is None or self._good[0] != key)
        self._seen = key
        try:
            doc = decode(raw, str(self.path))
            registry = Registry.parse(doc, self._layout, self._bundle_points, source=str(self.path))
        except RegistryError as exc:
            if not repeat:
                self._reject(exc.message)
            return False
        self._good = (key, doc)
        self._install(registry, f"{key[0]} sha256={key[1][:12]}")
        self.last_error = None
        self._count("success")
        return True

    def _from_file(self) -> bool:
        return self._current.source not in (None, "bundle")

    def _install(self, registry: Registry, what: str) -> None:
        for experiment, arm in registry.known_labels():  # bounded label values, present from the start
            self._metrics.experiment_requests.labels(experiment=experiment, arm=arm)
            self._metrics.experiment_request_duration.labels(experiment=experiment, arm=arm)
        self._current = registry
        self.loaded_at = time.time()
        log.info(
            "registry installed (%s): %d operating points %s, %d experiments %s, default %s",
            what, len(registry.operating_points), sorted(registry.operating_points),
            len(registry.experiments), sorted(registry.experiments), registry.default_operating_point,
        )

    def _reject(self, message: str) -> None:
        self.last_error = message
        self._count("failure")
        log.error("registry rejected: %s", message)

    def _count(self, result: str) -> None:
        self._metrics.registry_reloads.labels(result=result).inc()

    # --- background polling -----------------------------------------------------------------
    async def start(self) -> None:
        """Poll every ``poll_seconds`` in an asyncio task (file reads run in a worker thread)."""
        self._poller.start(self.poll_seconds)

    async def stop(self) -> None:
        await self._poller.stop()

    async def _check_in_thread(self) -> None:
        await asyncio.to_thread(self.check_now)
