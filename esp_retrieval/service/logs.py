"""Log lines for machines (JSON, one object per line) or for a terminal (text), with the request id.

``esp serve`` hands :func:`log_config` to uvicorn, so the service's loggers, uvicorn's own and
its access log share one format (setting ``ESP_LOG_FORMAT``: ``json``, the default, or
``text``). A JSON line holds ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and
``request_id`` (null outside a request), plus, on access lines, ``client``, ``method``,
``path``, ``http_version`` and ``status``; an exception adds ``exc_info``. Extra fields passed
with ``log.info(..., extra={...})`` become keys. An access line's path never holds the value of
a :data:`REDACTED_QUERY` parameter (``unit_id``: a user's or a session's id, as in
``GET /v1/experiments/{name}/assignment?unit_id=...``): it reads ``unit_id=REDACTED``.

The request id lives in a context variable (:data:`REQUEST_ID`) that
:class:`esp_retrieval.service.middleware.RequestIdMiddleware` sets for the whole request: every line logged
while serving it, the access line included (uvicorn writes it from the same task), carries it,
and the response echoes it in ``X-Request-ID``.
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote_plus

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["json", "text"]
LOG_FORMATS: tuple[str, ...] = ("json", "text")

#: The current request's id (None outside a request).
REQUEST_ID: ContextVar[str | None] = ContextVar("esp_request_id", default=None)
REQUEST_ID_HEADER = "X-Request-ID"
#: A caller's id is kept when it is 1-128 of these characters; anything else is replaced.
_CALLER_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")
#: query parameters whose values no log line holds
REDACTED_QUERY = frozenset({"unit_id"})
REDACTED = "REDACTED"


def request_id_from(header: bytes | None) -> str:
    """The caller's ``X-Request-ID`` when it is a plain token, else a new random id."""
    if header:
        try:
            value = header.decode("ascii")
        except UnicodeDecodeError:
            value = ""
        if _CALLER_ID.fullmatch(value):
            return value
    return uuid.uuid4().hex


def redact_path(path: str) -> str:
    """``path`` (with its query string) where each :data:`REDACTED_QUERY` parameter's value is
    :data:`REDACTED`; names are compared decoded, as the route reads them."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    items = []
    for item in query.split("&"):
        name = item.split("=", 1)[0]
        items.append(f"{name}={REDACTED}" if unquote_plus(name) in REDACTED_QUERY else item)
    return f"{base}?{'&'.join(items)}"


def current_request_id() -> str | None:
    return REQUEST_ID.get()


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record (and, for uvicorn's access records, the request
    fields from its positional arguments: client, method, path, HTTP version, status; the path,
    in the fields and the message, through :func:`redact_path`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, version, status = record.args
            if isinstance(path, str):
                record.args = (client, method, redact_path(path), version, status)
            for key, value in zip(_ACCESS_FIELDS, record.args, strict=True):
                setattr(record, key, value)
        return True


class JsonLineFormatter(JsonFormatter):
    """One JSON object per record: time, level, logger, message, request_id, extras."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            json_ensure_ascii=False,
            **kwargs,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")
        super().add_fields(log_data, record, message_dict)
        log_data.setdefault("request_id", getattr(record, "request_id", None))
        # uvicorn's own record fields say nothing a line does not already hold
        for noise in ("color_message", "taskName"):
            log_data.pop(noise, None)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "request_id", None) is None:
            record.request_id = "-"
        return super().format(record)


FORMATTERS: dict[str, type[logging.Formatter]] = {"json": JsonLineFormatter, "text": TextFormatter}


def log_config(fmt: str = "json", level: str = "info") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` document (uvicorn's ``log_config``): every logger,
    uvicorn's access log included, writes ``fmt`` lines to stderr (access lines to stdout, as
    uvicorn does)."""
    if fmt not in FORMATTERS:
        raise ValueError(f"log format {fmt!r} is invalid; allowed: {list(FORMATTERS)}")
    formatter = {"()": f"{__name__}.{FORMATTERS[fmt].__name__}"}
    handler = {"formatter": "line", "filters": ["request_id"], "class": "logging.StreamHandler"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": f"{__name__}.RequestIdFilter"}},
        "formatters": {"line": formatter},
        "handlers": {
            "default": {**handler, "stream": "ext://sys.stderr"},
            "access": {**handler, "stream": "ext://sys.stdout"},
        },
        "root": {"handlers": ["default"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }
