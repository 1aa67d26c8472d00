"""Requests answered before routing (413, an early 429) are labelled by the app's route paths,
read from its routes: generating the OpenAPI document for it cost the first such request about
half a second of the event loop, which the adaptive in-flight limit then read as a late answer."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.service.middleware import UNMATCHED, route_template


def _scope(app: Any, path: str) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "app": app}


def test_an_unrouted_request_is_labelled_from_the_routes_without_the_openapi_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(Settings())

    def no_openapi() -> NoReturn:
        raise AssertionError("the OpenAPI document was generated to label a request")

    monkeypatch.setattr(app, "openapi", no_openapi)
    assert route_template(_scope(app, "/v1/search")) == "/v1/search"
    assert route_template(_scope(app, "/v1/documents/doc-7")) == "/v1/documents/{doc_id}"
    assert route_template(_scope(app, "/metrics")) == "/metrics"
    assert route_template(_scope(app, "/no/such/route")) == UNMATCHED
