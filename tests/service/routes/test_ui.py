"""GET /ui in process: the page and its files come from the package, nothing else is reachable,
and the page refers to nothing outside the service (the browser test checks what it loads)."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.config import Settings
from service.routes.ui import ASSETS, UI_DIR

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(Settings()))


def test_the_page_and_each_asset_are_served_with_their_media_type(client: TestClient) -> None:
    page = client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "<title>ESP playground</title>" in page.text
    for name, media_type in ASSETS.items():
        r = client.get(f"/ui/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == media_type
        assert r.content == (UI_DIR / name).read_bytes()


@pytest.mark.parametrize("name", ["nope.js", "..%2Fapp.py", "%2E%2E", "index.htm", "py.typed"])
def test_any_other_name_is_404_with_the_error_body(client: TestClient, name: str) -> None:
    r = client.get(f"/ui/{name}")
    assert r.status_code == 404
    body = r.json()
    assert body["type"] == "not_found"
    if body["field"] is not None:  # an unknown name (a path with '/' never reaches the route)
        assert body["field"] == "name"
        assert "app.js" in body["message"]


def test_a_path_outside_the_ui_folder_is_not_reachable(client: TestClient) -> None:
    for path in ("/ui/../service/app.py", "/ui/%2e%2e/routes/ui.py", "/ui/routes/ui.py"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert "def create_app" not in r.text and "ASSETS" not in r.text


def test_the_page_is_not_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]


def test_every_file_of_the_page_is_listed_and_shipped_as_package_data() -> None:
    """ASSETS is the folder's content, and pyproject's package-data globs cover each file, so an
    installed (non-editable) package serves the same page."""
    files = sorted(p.name for p in UI_DIR.iterdir() if p.is_file())
    assert files == sorted(ASSETS)
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["service"]
    for name in files:
        assert any(fnmatch(f"ui/{name}", g) for g in globs), name


def test_the_page_names_no_other_host() -> None:
    """No CDN, no font or script from elsewhere: every URL in the page's files is relative."""
    absolute = re.compile(r"""(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}|\burl\(\s*['"]?(?:https?:)?//""")
    for name in ASSETS:
        text = (UI_DIR / name).read_text(encoding="utf-8")
        assert not absolute.findall(text), name
    html = (UI_DIR / "index.html").read_text(encoding="utf-8")
    refs = re.findall(r"""(?:src|href)="([^"]+)\"""", html)
    assert sorted(refs) == ["data:,", "ui/app.js", "ui/style.css"]
