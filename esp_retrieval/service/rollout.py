"""Fleet-wide bundle rollout: every replica serves the bundle the registry file names.

``POST /v1/admin/reload`` through a Kubernetes Service reaches one random pod. The declarative
path: the registry file (the ConfigMap every replica mounts and watches) names the desired
bundle::

    bundle:
      path: /models/bundles/2026-01-07      # a directory every replica can read
      sha256: 3f1c...                        # sha256 of that bundle's manifest.json

``manifest.json`` lists the sha256 of every other file of the bundle, so its digest pins the
whole bundle (``esp bundle-info DIR`` prints it as ``manifest_sha256``). The ``path`` may be
the URI of a bundle in object storage (``s3://models/esp/2026-01-07``, ``https://...``): its
manifest is read alone and compared first, then the bundle is fetched into ``ESP_BUNDLE_CACHE``
(:mod:`esp_retrieval.service.remote_bundle`) and loaded from there. Every replica's
:class:`RolloutReconciler` polls the file (``ESP_REGISTRY_POLL_SECONDS``) and, when the bundle it
names is not the one served: checks the manifest's digest, then loads, verifies every checksum,
warms and swaps it in through :func:`esp_retrieval.service.lifecycle.load_and_activate`, the path of every
reload. A bundle that fails (wrong digest, a corrupt file, a layout the registry does not fit)
or one outside ``ESP_BUNDLE_ROOTS`` (:mod:`esp_retrieval.service.bundle_roots`, checked before its manifest is
read) is refused, logged and counted, the served one is kept, and the same bundle is not tried again
until the file names another or the bundle's manifest changes.

Each replica reports what it serves and whether that is what the file asks for: ``/readyz``
(``bundle_sha256`` and ``rollout``), ``esp_bundle_info{version}`` and
``esp_bundle_in_sync`` (1: serving the named bundle, or none is named). The chart's alerts
``ESPBundleVersionsDisagree`` (replicas of one deployment serve different versions) and
``ESPBundleRolloutStuck`` (a replica not on the named bundle) fire after
``for`` minutes (docs in the chart's README). Without a ``bundle`` key nothing changes: the
bundle given at start (``ESP_BUNDLE``) and admin reloads rule.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esp_retrieval.service.bundle_roots import BundleRootError, check_bundle_source
from esp_retrieval.service.config import Settings
from esp_retrieval.service.errors import ReloadRefusedError
from esp_retrieval.service.lifecycle import load_and_activate
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.polling import Poller
from esp_retrieval.service.remote_bundle import BundleFetchError, is_uri, remote_manifest_sha256
from esp_retrieval.service.state import ServingState, StateHolder
from esp_retrieval.service.tuning.errors import RegistryError
from esp_retrieval.service.tuning.loader import decode
from esp_retrieval.service.tuning.schema import DesiredBundleSpec, desired_bundle

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
ROLLOUT_FIELD = "bundle.path"  # where the registry file names the bundle


def manifest_sha256(bundle_dir: str | Path) -> str:
    """The digest that names a bundle in the registry file: sha256 of its ``manifest.json``."""
    return hashlib.sha256((Path(bundle_dir) / MANIFEST).read_bytes()).hexdigest()


@dataclass
class RolloutStatus:
    """What ``/readyz`` reports: the bundle the file names and where this replica stands."""

    path: str | None = None
    sha256: str | None = None
    state: str = "none"  # none | pending | loading | in_sync | refused
    reason: str | None = None
    since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "state": self.state, "reason": self.reason,
                "since": self.since}


class RolloutReconciler:
    """Reconciles the served bundle with the registry file's ``bundle`` (``app.state.rollout``)."""

    def __init__(self, app_state: Any, settings: Settings) -> None:
        self.app_state = app_state
        self.settings = settings
        self.path = settings.registry
        self.poll_seconds = settings.registry_poll_seconds
        self.status = RolloutStatus()
        self._refused: tuple[str, str, str] | None = None  # (path, wanted sha, manifest sha) refused
        self._digests: dict[int, str | None] = {}  # id(state) -> its manifest digest
        self._poller = Poller("esp-bundle-rollout", self.check_now, what="rollout check", check_first=True)

    @property
    def metrics(self) -> Metrics:
        metrics: Metrics = self.app_state.metrics
        return metrics

    def served_sha256(self, state: ServingState | None) -> str | None:
        """The manifest digest of ``state``'s bundle (computed once per served state)."""
        if state is None:
            return None
        key = id(state)
        if key not in self._digests:
            try:
                self._digests = {key: manifest_sha256(state.bundle.path)}
            except OSError:
                self._digests = {key: None}
        return self._digests[key]

    def desired(self) -> DesiredBundleSpec | None:
        """The ``bundle`` the file names now (None: no file, no key, or a file that does not parse)."""
        if self.path is None:
            return None
        try:
            doc = decode(self.path.read_bytes(), str(self.path))
            return desired_bundle(doc, str(self.path))
        except FileNotFoundError:
            return None
        except (OSError, RegistryError) as exc:  # the registry watcher reports the file's problems
            log.debug("rollout: registry file unusable: %s", exc)
            return None

    def _set(self, state: str, reason: str | None = None) -> None:
        if state != self.status.state or reason != self.status.reason:
            self.status.state, self.status.reason, self.status.since = state, reason, time.time()

    async def check_now(self) -> bool:  # noqa: PLR0911 - one return per outcome
        """One reconciliation; returns whether a new bundle was swapped in."""
        holder: StateHolder = self.app_state.holder
        want = await asyncio.to_thread(self.desired)
        served = holder.current
        if want is None:
            since = self.status.since if self.status.state == "none" else time.time()
            self.status = RolloutStatus(since=since)
            self.metrics.bundle_in_sync.set(1)
            return False
        self.status.path, self.status.sha256 = want.path, want.sha256
        if served is not None and self.served_sha256(served) == want.sha256:
            self._set("in_sync")
            self.metrics.bundle_in_sync.set(1)
            return False
        self.metrics.bundle_in_sync.set(0)
        if served is None and holder.error is None:
            self._set("pending", "waiting for the initial load")
            return False  # the bundle given at start is still loading: swap after it
        remote = is_uri(want.path)
        try:  # nothing outside ESP_BUNDLE_ROOTS is read, not even its manifest
            check_bundle_source(want.path, self.settings.allowed_roots, ROLLOUT_FIELD)
        except BundleRootError as exc:
            if (outside := (want.path, want.sha256, "outside the bundle roots")) != self._refused:
                self._refuse(outside, exc.message)
            return False
        try:
            actual = await asyncio.to_thread(remote_manifest_sha256 if remote else manifest_sha256, want.path)
        except BundleFetchError as exc:
            actual = f"unreadable: {exc}"
        except OSError as exc:
            actual = f"unreadable: {exc.strerror or exc}"
        key = (want.path, want.sha256, actual)
        if key == self._refused:
            return False  # already refused; tried again when the file or the bundle changes
        if actual != want.sha256:
            self._refuse(key, f"{want.path}/{MANIFEST}: sha256 is {actual}, the registry names {want.sha256}")
            return False
        self._set("loading")
        try:
            source = want.path if remote else Path(want.path)
            _, new = await load_and_activate(self.app_state, source, self.settings, sha256=want.sha256,
                                             field=ROLLOUT_FIELD)
        except ReloadRefusedError as exc:
            self._refuse(key, exc.message)
            return False
        if self.served_sha256(new) != want.sha256:  # the folder changed while it was loaded
            self._set("pending", "the bundle changed while it was loaded; retrying")
            return True
        self._refused = None
        self._set("in_sync")
        self.metrics.bundle_in_sync.set(1)
        log.info("rollout: serving bundle %s from %r as the registry names (sha256 %s)",
                 new.version, want.path, want.sha256[:12])
        return True

    def _refuse(self, key: tuple[str, str, str], reason: str) -> None:
        self._refused = key
        self._set("refused", reason)
        self.metrics.bundle_rollout_refusals.inc()
        served = self.app_state.holder.current
        kept = served.version if served is not None else "none"
        log.error("rollout: bundle %r refused, still serving %s: %s", key[0], kept, reason)

    # --- background polling -------------------------------------------------------------------
    async def start(self) -> None:
        if self.path is not None:
            self._poller.start(self.poll_seconds)

    async def stop(self) -> None:
        await self._poller.stop()


def status_body(rollout: RolloutReconciler | None, state: ServingState | None) -> dict[str, Any]:
    """``bundle_sha256`` and ``rollout`` of the ``/readyz`` body."""
    if rollout is None:
        return {"bundle_sha256": None, "rollout": None}
    return {"bundle_sha256": rollout.served_sha256(state), "rollout": rollout.status.to_dict()}

