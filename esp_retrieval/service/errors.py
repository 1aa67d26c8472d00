"""One error shape and one table from exception class to error kind and HTTP status.

Body: ``{"type": <kind>, "message": <what and what is allowed>, "field": <dotted path or null>}``;
on the OpenAI-compatible routes (:data:`OPENAI_PATHS`) the same error in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}`` (:func:`openai_error_body`).
Domain code raises :class:`~esp_retrieval.subspace.errors.FieldError` or one of the subclasses below; it
knows nothing of HTTP. :data:`ERROR_KINDS` maps each class to its kind, looked up along the
exception's MRO (so ``RegistryError``, ``WeightError`` and every other ``FieldError`` are 422
unless a more specific class says otherwise), and :data:`STATUS` maps the kind to a status.
The app registers one handler per class of the table (:func:`error_response`); FastAPI's own
validation and HTTP errors leave in the same body (``esp_retrieval.service.app``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Send

from esp_retrieval.subspace.errors import FieldError


class NotReadyError(FieldError):
    """No bundle is served yet, or what is served cannot answer this now (-> 503).

    ``retry_after``: seconds a caller should wait (the ``Retry-After`` header), if known.
    """

    def __init__(self, message: str, field: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message, field)
        self.retry_after = retry_after


class OverloadedError(FieldError):
    """The queue is full; ``retry_after`` seconds is a fair wait (-> 429 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after: float, field: str | None = None) -> None:
        super().__init__(message, field)
        self.retry_after = retry_after


class ClientClosedError(FieldError):
    """The client disconnected before its answer; its queued work was dropped (-> 499, which
    nobody reads: it is what the request is counted as in the metrics and the access log)."""


class NotFoundError(FieldError):
    """What was asked for does not exist, or the route is disabled (-> 404)."""


class UnauthorizedError(FieldError):
    """No credentials were sent (-> 401 with ``WWW-Authenticate: Bearer``)."""


class ForbiddenError(FieldError):
    """The credentials sent are not valid (-> 403)."""


class ReloadRefusedError(FieldError):
    """A new bundle was refused; the served one is kept (-> 409)."""


class ReadOnlyIndexError(FieldError):
    """A write to an index that cannot change in place (an in-process bundle) (-> 409)."""


class ErrorKind(StrEnum):
    VALIDATION = "validation_error"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    OVERLOADED = "overloaded"
    NOT_READY = "not_ready"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    RELOAD_FAILED = "reload_failed"
    READ_ONLY = "read_only_index"
    CLIENT_CLOSED = "client_closed_request"
    INTERNAL = "internal_error"
    # answered by the HTTP protocol before any app ran (esp_retrieval.service.http_limits)
    REQUEST_TIMEOUT = "request_timeout"
    HEADERS_TOO_LARGE = "request_header_fields_too_large"


STATUS: dict[ErrorKind, int] = {
    ErrorKind.VALIDATION: 422,
    ErrorKind.BAD_REQUEST: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.REQUEST_TIMEOUT: 408,
    ErrorKind.PAYLOAD_TOO_LARGE: 413,
    ErrorKind.HEADERS_TOO_LARGE: 431,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.NOT_READY: 503,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.RELOAD_FAILED: 409,
    ErrorKind.READ_ONLY: 409,
    ErrorKind.CLIENT_CLOSED: 499,
    ErrorKind.INTERNAL: 500,
}

#: The one table: exception class -> error kind (hence status), looked up along the MRO.
ERROR_KINDS: dict[type[Exception], ErrorKind] = {
    FieldError: ErrorKind.VALIDATION,
    NotReadyError: ErrorKind.NOT_READY,
    OverloadedError: ErrorKind.OVERLOADED,
    NotFoundError: ErrorKind.NOT_FOUND,
    UnauthorizedError: ErrorKind.UNAUTHORIZED,
    ForbiddenError: ErrorKind.FORBIDDEN,
    ReloadRefusedError: ErrorKind.RELOAD_FAILED,
    ReadOnlyIndexError: ErrorKind.READ_ONLY,
    ClientClosedError: ErrorKind.CLIENT_CLOSED,
}


def error_kind(exc: BaseException) -> ErrorKind:
    """The kind of ``exc``: the table's entry for the first class of its MRO that has one."""
    for cls in type(exc).__mro__:
        kind = ERROR_KINDS.get(cls)
        if kind is not None:
            return kind
    return ErrorKind.INTERNAL


def error_headers(exc: BaseException) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) when the error says how long to wait;
    ``WWW-Authenticate`` for a missing token."""
    headers: dict[str, str] = {}
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def error_parts(exc: BaseException) -> tuple[dict[str, Any], int, dict[str, str]]:
    """A domain error's body, status and headers."""
    kind = error_kind(exc)
    message = exc.message if isinstance(exc, FieldError) else str(exc)
    field = exc.field if isinstance(exc, FieldError) else None
    return error_body(kind, message, field), STATUS[kind], error_headers(exc)


def error_response(exc: BaseException) -> JSONResponse:
    """The HTTP answer to a domain error: its kind's status, the error body and headers."""
    body, status, headers = error_parts(exc)
    return JSONResponse(body, status_code=status, headers=headers or None)


def kind_for_status(status: int) -> ErrorKind:
    """The kind whose status is ``status`` (for errors raised by the framework itself)."""
    for kind, code in STATUS.items():
        if code == status:
            return kind
    return ErrorKind.BAD_REQUEST if 400 <= status < 500 else ErrorKind.INTERNAL


def error_body(kind: ErrorKind, message: str, field: str | None = None) -> dict[str, Any]:
    return {"type": kind.value, "message": message, "field": field}


Headers = Sequence[tuple[bytes, bytes]]


def encoded_error(
    kind: ErrorKind, message: str, *, headers: Headers = (), close: bool = False
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """An error answered below the app (a middleware, the HTTP protocol): its kind's status, the
    response headers (JSON, its length, ``headers``, ``Connection: close`` when ``close``) and
    the body, for :func:`send_error` and :mod:`esp_retrieval.service.http_limits` alike."""
    payload = json.dumps(error_body(kind, message)).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    if close:  # the body was not read: the server closes (lingering) instead of reading it all
        head.append((b"connection", b"close"))
    return STATUS[kind], head, payload


async def send_error(
    send: Send, kind: ErrorKind, message: str, *, headers: Headers = (), close: bool = False
) -> None:
    """Answer an ASGI request with an error before (or instead of) the app: :func:`encoded_error`."""
    status, head, payload = encoded_error(kind, message, headers=headers, close=close)
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


# --- the OpenAI-compatible routes answer errors in OpenAI's shape ------------------------------

#: Paths (and their sub-paths) whose errors take OpenAI's shape, for OpenAI clients to read.
OPENAI_PATHS = ("/v1/embeddings", "/v1/models")

#: OpenAI's error ``type`` by status; anything else in 4xx is an ``invalid_request_error``.
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                 429: "rate_limit_error"}


def is_openai_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS)


def openai_error_body(body: dict[str, Any], status: int, code: str | None = None) -> dict[str, Any]:
    """``{"type", "message", "field"}`` -> OpenAI's ``{"error": {"message", "type", "param",
    "code"}}``: ``param`` is the field, ``code`` a specific reason (``token_ids_not_supported``)
    or this service's kind (``validation_error``, ``not_ready``, ...)."""
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": body["message"], "type": kind, "param": body.get("field"),
                      "code": code or body["type"]}}
