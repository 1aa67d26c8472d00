"""The pages (``/ui``, ``/docs``, ``/redoc``) carry a Content-Security-Policy that allows only what
they load from the service (an inline script only by its hash) and forbids framing by any other
page (clickjacking); the browser tests check that the pages still render under it."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings

PAGES = ["/ui", "/ui/app.js", "/docs", "/redoc", "/docs/oauth2-redirect"]


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(Settings()))


def _policy(header: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (x.strip() for x in header.split(";")) if d}


@pytest.mark.parametrize("path", PAGES)
def test_every_page_forbids_framing_and_other_origins(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 200
    policy = _policy(r.headers["content-security-policy"])
    assert policy["frame-ancestors"] == ["'none'"] and r.headers["x-frame-options"] == "DENY"
    assert policy["default-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"]
    scripts = policy["script-src"]
    assert scripts[0] == "'self'" and "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_a_docs_page_allows_exactly_its_own_inline_scripts(client: TestClient, path: str) -> None:
    r = client.get(path)
    inline = re.findall(rb"<script>(.*?)</script>", r.content, re.DOTALL)
    hashes = {f"'sha256-{base64.b64encode(hashlib.sha256(s).digest()).decode()}'" for s in inline}
    assert set(_policy(r.headers["content-security-policy"])["script-src"][1:]) == hashes
    assert (path == "/redoc") == (not hashes)  # ReDoc's page has no inline script


def test_the_playground_allows_no_inline_style_either(client: TestClient) -> None:
    policy = _policy(client.get("/ui").headers["content-security-policy"])
    assert policy["style-src"] == ["'self'"] and policy["script-src"] == ["'self'"]
