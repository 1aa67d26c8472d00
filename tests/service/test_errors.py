"""The one table from exception class to error kind and status, looked up along the MRO."""

from __future__ import annotations

import json

import pytest

from esp_retrieval.service import errors
from esp_retrieval.subspace.bundle import BundleError
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.weights import WeightError


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (FieldError("bad", "k"), 422, "validation_error"),
        (WeightError("bad weights", "weights"), 422, "validation_error"),  # a subclass: found on its MRO
        (BundleError("bad bundle"), 422, "validation_error"),
        (errors.NotReadyError("not ready"), 503, "not_ready"),
        (errors.OverloadedError("full", retry_after=0.2), 429, "overloaded"),
        (errors.NotFoundError("no such thing", "name"), 404, "not_found"),
        (errors.UnauthorizedError("no token"), 401, "unauthorized"),
        (errors.ForbiddenError("wrong token"), 403, "forbidden"),
        (errors.ReloadRefusedError("refused"), 409, "reload_failed"),
        (RuntimeError("boom"), 500, "internal_error"),
    ],
)
def test_each_class_has_its_status(exc: Exception, status: int, kind: str) -> None:
    assert errors.STATUS[errors.error_kind(exc)] == status
    assert errors.error_kind(exc).value == kind


def test_a_subclass_of_a_domain_error_keeps_its_parents_status() -> None:
    class Draining(errors.NotReadyError):
        pass

    assert errors.error_response(Draining("draining")).status_code == 503


def test_the_response_carries_message_field_and_headers() -> None:
    r = errors.error_response(errors.OverloadedError("queue full", retry_after=0.2, field="queries"))
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"  # whole seconds, at least 1
    assert json.loads(bytes(r.body)) == {"type": "overloaded", "message": "queue full", "field": "queries"}
    assert errors.error_response(errors.UnauthorizedError("no token")).headers["www-authenticate"] == "Bearer"
    assert "retry-after" not in errors.error_response(errors.NotReadyError("shutting down")).headers
    assert errors.error_response(errors.NotReadyError("loading", retry_after=1)).headers["retry-after"] == "1"


def test_every_status_answered_below_the_app_has_its_own_kind_in_the_one_table() -> None:
    """408 and 431 (the HTTP protocol's) are kinds of the table with their own status, not
    ``bad_request`` (400); the writer below the app takes the status from the table."""
    from esp_retrieval.service.errors import STATUS, ErrorKind, encoded_error, kind_for_status

    for status in (400, 408, 413, 429, 431, 503):
        kind = kind_for_status(status)
        assert STATUS[kind] == status
        code, headers, payload = encoded_error(kind, "m", close=True)
        assert code == status and (b"connection", b"close") in headers
        assert json.loads(payload) == {"type": kind.value, "message": "m", "field": None}
    assert kind_for_status(431) is ErrorKind.HEADERS_TOO_LARGE and kind_for_status(408) is ErrorKind.REQUEST_TIMEOUT
