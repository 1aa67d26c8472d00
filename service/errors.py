"""One error shape and one table from error kind to HTTP status, used by every route.

Body: ``{"type": <kind>, "message": <what and what is allowed>, "field": <dotted path or null>}``.
Raise :class:`ServiceError` (or a subclass) anywhere in the service; the app's exception
handlers turn it, and FastAPI's own validation errors, into this body and status.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from starlette.responses import JSONResponse

from subspace.errors import FieldError


class NotReadyError(FieldError):
    """Domain error: no bundle is served yet, or what is served cannot answer this now (-> 503)."""


class OverloadedError(FieldError):
    """Domain error: the queue is full; ``retry_after`` seconds is a fair wait (-> 429)."""

    def __init__(self, message: str, retry_after: float, field: str | None = None) -> None:
        super().__init__(message, field)
        self.retry_after = retry_after


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
    INTERNAL = "internal_error"


STATUS: dict[ErrorKind, int] = {
    ErrorKind.VALIDATION: 422,
    ErrorKind.BAD_REQUEST: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.PAYLOAD_TOO_LARGE: 413,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.NOT_READY: 503,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.RELOAD_FAILED: 409,
    ErrorKind.INTERNAL: 500,
}


class ServiceError(Exception):
    """An error with a kind (hence a status), a message for the caller and the field at fault."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.field = field
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS[self.kind]

    def body(self) -> dict[str, Any]:
        return error_body(self.kind, self.message, self.field)

    def response(self) -> JSONResponse:
        """The HTTP answer: :meth:`body` with the kind's status and any headers (``Retry-After``)."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)


def kind_for_status(status: int) -> ErrorKind:
    """The kind whose status is ``status`` (for errors raised by the framework itself)."""
    for kind, code in STATUS.items():
        if code == status:
            return kind
    return ErrorKind.BAD_REQUEST if 400 <= status < 500 else ErrorKind.INTERNAL


def error_body(kind: ErrorKind, message: str, field: str | None = None) -> dict[str, Any]:
    return {"type": kind.value, "message": message, "field": field}
