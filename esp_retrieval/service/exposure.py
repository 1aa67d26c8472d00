"""The exposure log: one JSON record per search served by an experiment arm, for A/B platforms.

An A/B platform joins exposures (who saw which arm, when) with outcomes (clicks, conversions)
that it logs itself. A search is an exposure when it names an ``experiment`` and its unit is
inside the experiment's traffic (the response says ``in_experiment: true``; the same searches
``esp_experiment_requests_total`` counts). Each one writes one line::

    {"time": "2026-01-01T12:00:00.123+00:00", "request_id": "...", "experiment": "ent",
     "arm": "treatment", "unit_id": "sha256:...", "unit_id_hashed": true,
     "operating_point": "entity_heavy", "bundle_version": "6df870f4b884", "k": 10, "queries": 1,
     "latency_ms": 3.1, "ids": [["doc-1", "doc-7", ...]]}

``request_id`` is the ``X-Request-ID`` the response carries (the caller's own when it sent
one), so records join the responses, and the outcome events the caller logs with that id, by
request id; ``unit_id`` joins by unit. Settings (``ESP_EXPOSURE_*``, :mod:`esp_retrieval.service.config`):

- ``exposure_log``: ``off`` (default), ``stdout`` (one bare JSON object per line; uvicorn's access
  lines go to stdout too: a record has an ``experiment`` key and no ``logger``) or ``file``
  (``exposure_log_path``, rotated at ``exposure_log_max_bytes``, ``exposure_log_backups`` kept);
- ``exposure_sample_rate``: the share of *units* logged, decided by ``sha256(unit_id)``, so a
  sampled unit has all its exposures logged and the others none (per-unit analyses stay whole);
- ``exposure_hash_unit_id`` (default true): ``sha256(exposure_salt:unit_id)`` as
  ``"sha256:<hex>"`` instead of the raw id. Without ``exposure_salt`` the salt is random (an
  empty one would let anyone recover a unit from its record by hashing ``":" + guess``):
  generated at the first start and kept in ``exposure_salt_file`` (default: the log file's path
  plus ``.salt``, mode 0600; the first of several replicas sharing it wins), or, with ``stdout``
  and no file, new at every start; a warning says which (:func:`exposure_salt`);
- ``exposure_include_ids``: add ``ids``, the returned document ids per query.

Records are written by a dedicated logger (``esp.exposure``, not propagated), so they never
mix with the service's log format.
"""

from __future__ import annotations

import hashlib
import json
import logging
import logging.handlers
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from esp_retrieval.service.config import Settings
from esp_retrieval.service.logs import current_request_id

LOGGER_NAME = "esp.exposure"
SALT_SUFFIX = ".salt"
_SCALE = float(2**64)

log = logging.getLogger(__name__)


def unit_sampled(unit_id: str, rate: float) -> bool:
    """Whether ``unit_id`` is in the logged share ``rate`` (the same answer in every replica)."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(f"exposure-sample:{unit_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE < rate


def hashed_unit(unit_id: str, salt: str) -> str:
    return "sha256:" + hashlib.sha256(f"{salt}:{unit_id}".encode()).hexdigest()


def exposure_salt(settings: Settings) -> str:
    """``exposure_salt``, else a random salt: read from ``exposure_salt_file`` (default: the log
    file's path + ``.salt``), or generated and stored there at the first start, or, with no file
    (``stdout``), new for this process. Anything but a set salt logs a warning."""
    if settings.exposure_salt:
        return settings.exposure_salt
    path = settings.exposure_salt_file
    if path is None and settings.exposure_log == "file" and settings.exposure_log_path is not None:
        path = settings.exposure_log_path.with_name(settings.exposure_log_path.name + SALT_SUFFIX)
    if path is None:
        log.warning(
            "ESP_EXPOSURE_SALT is not set: exposure records hash unit ids with a random salt of this "
            "process, so hashes change at every start (set ESP_EXPOSURE_SALT, the same on every "
            "replica, or ESP_EXPOSURE_SALT_FILE)"
        )
        return secrets.token_hex(32)
    salt, created = _stored_salt(path)
    log.warning(
        "ESP_EXPOSURE_SALT is not set: exposure records hash unit ids with the random salt %s %s "
        "(set ESP_EXPOSURE_SALT, the same on every replica, to choose it)",
        "generated now and kept in" if created else "kept in",
        str(path),
    )
    return salt


def _stored_salt(path: Path) -> tuple[str, bool]:
    """``(salt, created)``: the salt in ``path``, or a new one written there (mode 0600) when
    there is none; of several processes starting at once, the first one's link wins."""
    if path.exists():
        return _read_salt(path), False
    path.parent.mkdir(parents=True, exist_ok=True)
    salt = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(salt + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)  # never a partial file, never one salt over another
    except FileExistsError:
        return _read_salt(path), False
    finally:
        tmp.unlink(missing_ok=True)
    return salt, True


def _read_salt(path: Path) -> str:
    salt = path.read_text(encoding="utf-8").strip()
    if not salt:
        raise ValueError(f"{path}: the exposure salt file is empty (delete it to generate a salt, "
                         "or set ESP_EXPOSURE_SALT)")
    return salt


def _stdout_handler() -> logging.Handler:
    return logging.StreamHandler(sys.stdout)


def _file_handler(settings: Settings) -> logging.Handler:
    if settings.exposure_log_path is None:
        raise ValueError("exposure_log=file needs exposure_log_path (ESP_EXPOSURE_LOG_PATH)")
    settings.exposure_log_path.parent.mkdir(parents=True, exist_ok=True)
    return logging.handlers.RotatingFileHandler(
        settings.exposure_log_path,
        maxBytes=settings.exposure_log_max_bytes,
        backupCount=settings.exposure_log_backups,
        encoding="utf-8",
    )


#: exposure_log setting -> how its handler is made
SINKS: dict[str, Callable[[Settings], logging.Handler]] = {
    "stdout": lambda _settings: _stdout_handler(),
    "file": _file_handler,
}


class ExposureLog:
    """Writes exposure records (``app.state.exposure``); :meth:`disabled` writes nothing."""

    def __init__(self, settings: Settings, handler: logging.Handler | None) -> None:
        self.settings = settings
        self._handler = handler
        hashing = handler is not None and settings.exposure_hash_unit_id
        try:  # the salt of hashed unit ids: only needed (and generated) when records are written
            self.salt = exposure_salt(settings) if hashing else ""
        except BaseException:
            if handler is not None:
                handler.close()
            raise
        self._log = logging.getLogger(f"{LOGGER_NAME}.{id(self):x}")  # one per app: tests run several
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        if handler is not None:
            handler.setFormatter(logging.Formatter("%(message)s"))
            self._log.addHandler(handler)

    @classmethod
    def from_settings(cls, settings: Settings) -> ExposureLog:
        sink = SINKS.get(settings.exposure_log)
        return cls(settings, sink(settings) if sink is not None else None)

    @property
    def enabled(self) -> bool:
        return self._handler is not None

    def record(
        self,
        *,
        experiment: str,
        arm: str,
        unit_id: str,
        operating_point: str | None,
        bundle_version: str,
        k: int,
        queries: int,
        latency_seconds: float,
        ids: Sequence[Sequence[str]] | None = None,
    ) -> dict[str, Any] | None:
        """Write one record (when enabled and the unit is sampled) and return it."""
        s = self.settings
        if self._handler is None or not unit_sampled(unit_id, s.exposure_sample_rate):
            return None
        rec: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "request_id": current_request_id(),
            "experiment": experiment,
            "arm": arm,
            "unit_id": hashed_unit(unit_id, self.salt) if s.exposure_hash_unit_id else unit_id,
            "unit_id_hashed": s.exposure_hash_unit_id,
            "operating_point": operating_point,
            "bundle_version": bundle_version,
            "k": k,
            "queries": queries,
            "latency_ms": round(latency_seconds * 1000.0, 3),
        }
        if s.exposure_include_ids and ids is not None:
            rec["ids"] = [list(q) for q in ids]
        self._log.info(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
        return rec

    def close(self) -> None:
        if self._handler is not None:
            self._log.removeHandler(self._handler)
            self._handler.close()
            self._handler = None


def log_search_exposure(
    log: ExposureLog | None,
    *,
    resolved: Any,
    unit_id: str | None,
    bundle_version: str,
    k: int,
    results: Sequence[dict[str, Any]],
    latency_seconds: float,
) -> dict[str, Any] | None:
    """The exposure record of one served search (``resolved``: its
    :class:`esp_retrieval.service.tuning.Resolved`), when it is one and the log is on."""
    if log is None or not log.enabled or resolved.experiment is None or resolved.arm is None:
        return None
    if resolved.excluded or unit_id is None:
        return None
    ids = [[hit["id"] for hit in r["hits"]] for r in results] if log.settings.exposure_include_ids else None
    return log.record(
        experiment=resolved.experiment,
        arm=resolved.arm,
        unit_id=unit_id,
        operating_point=resolved.operating_point,
        bundle_version=bundle_version,
        k=k,
        queries=len(results),
        latency_seconds=latency_seconds,
        ids=ids,
    )
