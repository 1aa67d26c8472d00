"""The framework internals the service relies on, one test each, so an upgrade that moves one
fails here by name instead of somewhere in a live test. pyproject.toml pins fastapi, starlette,
uvicorn and httptools to the minor versions these hold for.

Used by the search wing's codec (esp_retrieval/service/search/codec.py), the route-template lookup
(esp_retrieval/service/middleware.py) and the HTTP limits protocol (esp_retrieval/service/http_limits.py).
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request

#: Dependant fields read by ``esp_retrieval.service.search.codec._DirectCall`` / ``_needs_only``.
DEPENDANT_FIELDS = (
    "call", "name", "body_params", "dependencies", "path_params", "query_params", "header_params",
    "cookie_params", "request_param_name", "websocket_param_name", "http_connection_param_name",
    "response_param_name", "background_tasks_param_name", "security_scopes_param_name",
)


def test_fastapi_dependant_has_the_fields_the_direct_call_reads() -> None:
    fields = {f.name for f in dataclasses.fields(Dependant)}
    assert set(DEPENDANT_FIELDS) <= fields, set(DEPENDANT_FIELDS) - fields


class Body(BaseModel):
    x: int


def test_fastapi_route_exposes_its_body_field_and_dependant() -> None:
    async def endpoint(body: Body) -> dict[str, int]:
        return {"x": body.x}

    route = APIRoute("/p", endpoint, methods=["POST"])
    assert route.body_field is not None and route.body_field.field_info.annotation is Body
    assert isinstance(route.dependant, Dependant) and route.dependant.body_params[0].name == "body"
    assert callable(route.get_route_handler())


def test_fastapi_telemetry_is_off_unless_configured() -> None:
    from fastapi.telemetry import get_telemetry_data

    FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})
    assert get_telemetry_data() is None  # what the codec's direct call requires


def test_fastapi_iter_route_contexts_yields_the_app_routes() -> None:
    from fastapi.routing import iter_route_contexts

    app = FastAPI()

    @app.get("/a/{x}")
    async def a(x: int) -> int:
        return x

    assert "/a/{x}" in [r.path for r in iter_route_contexts(app.routes)]


def test_starlette_request_keeps_the_send_it_was_given() -> None:
    async def receive() -> dict[str, object]:
        return {"type": "http.request"}

    async def send(message: object) -> None:
        return None

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)
    assert request._send is send  # the codec rebuilds the request with it


def test_uvicorn_httptools_protocol_has_what_the_limits_protocol_overrides_and_reads() -> None:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

    overridden = ("connection_made", "connection_lost", "data_received", "on_message_begin", "on_header",
                  "on_headers_complete", "on_message_complete", "send_400_response", "on_response_complete")
    called = ("_unset_keepalive_if_required", "_should_upgrade", "handle_websocket_upgrade",
              "_unsupported_upgrade_warning")
    missing = [m for m in (*overridden, *called) if not callable(getattr(HttpToolsProtocol, m, None))]
    assert not missing
    init = inspect.getsource(HttpToolsProtocol.__init__) + inspect.getsource(HttpToolsProtocol.connection_made)
    attributes = ("parser", "cycle", "flow", "transport", "server_state", "connections", "tasks",
                  "limit_concurrency", "logger", "loop", "app", "scope")
    source = inspect.getsource(HttpToolsProtocol)
    assert [a for a in attributes if f"self.{a} =" not in source and f"self.{a}: " not in source] == [], init
    cycle = inspect.getsource(RequestResponseCycle.__init__)
    assert [a for a in ("response_complete", "response_started", "disconnected", "message_event", "transport")
            if f"self.{a}" not in cycle] == []
    assert {400, 408, 413, 431, 503} <= set(STATUS_LINE)


@pytest.mark.parametrize("package", ["fastapi", "starlette", "uvicorn", "httptools"])
def test_the_installed_framework_is_inside_the_pinned_range(package: str) -> None:
    """The range in pyproject.toml is the one this file's tests were written against."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    reqs = [Requirement(r) for extra in pyproject["project"]["optional-dependencies"].values() for r in extra]
    (req,) = [r for r in reqs if r.name == package]
    assert req.specifier, f"{package} must be pinned to a range"
    assert version(package) in req.specifier
