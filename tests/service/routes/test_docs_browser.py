"""``/docs`` and ``/redoc`` in a real headless Chromium with the network off (tests/browser.py):
the pages render the API's operations from assets the service serves itself (no CDN)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.live_server import LiveServer
from esp_retrieval.service.routes.docs import ASSETS
from tests.browser import Visit

SEARCH_SUMMARY = "Exact weighted top-k over all subspaces, weights chosen per request"


def _only_loopback(visit: Visit, server: LiveServer) -> None:
    assert visit.blocked == [], visit.blocked
    assert visit.outside(server.url) == [], visit.outside(server.url)
    assert visit.errors == [], visit.errors
    assert [e for e in visit.console_errors if "Content Security Policy" in e] == []  # renders under it


def test_swagger_ui_shows_the_operations_offline(loopback_page: Callable[..., Visit], vectors_served: LiveServer) -> None:
    visit = loopback_page(f"{vectors_served.url}/docs")
    page = visit.page
    page.wait_for_selector(".opblock-summary-path")
    paths = set(page.locator(".opblock-summary-path").all_inner_texts())
    spec = httpx.get(f"{vectors_served.url}/openapi.json", timeout=30).json()
    assert {p.replace("\u200b", "") for p in paths} == set(spec["paths"])  # every operation, no more
    assert {"/v1/search", "/v1/embeddings", "/readyz"} <= set(spec["paths"])
    page.get_by_text(SEARCH_SUMMARY).first.wait_for()
    assert visit.count("GET", "/docs/assets/swagger-ui-bundle.js") == 1
    assert visit.count("GET", "/openapi.json") == 1
    _only_loopback(visit, vectors_served)


def test_redoc_shows_the_operations_offline(loopback_page: Callable[..., Visit], vectors_served: LiveServer) -> None:
    visit = loopback_page(f"{vectors_served.url}/redoc")
    page = visit.page
    page.get_by_role("heading", name=SEARCH_SUMMARY).first.wait_for()
    assert page.get_by_text("/v1/embeddings").count() >= 1
    assert visit.count("GET", "/docs/assets/redoc.standalone.js") == 1
    _only_loopback(visit, vectors_served)


def test_assets_are_served_and_others_are_404(vectors_served: LiveServer) -> None:
    for name, media_type in ASSETS.items():
        r = httpx.get(f"{vectors_served.url}/docs/assets/{name}", timeout=30)
        assert r.status_code == 200 and r.headers["content-type"] == media_type and len(r.content) > 1000
    r = httpx.get(f"{vectors_served.url}/docs/assets/..%2Fconsts.py", timeout=30)
    assert r.status_code == 404
    page = httpx.get(f"{vectors_served.url}/docs", timeout=30).text
    assert "cdn" not in page and "googleapis" not in page


@pytest.fixture(scope="module")
def framer() -> Iterator[Callable[[str], str]]:
    """``url(src) -> page URL``: a page of another origin (another loopback port: a public one
    would be refused local access anyway) that shows ``src`` in an iframe."""
    pages: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def url(src: str) -> str:
        path = f"/framer{len(pages)}"
        pages[path] = f'<!doctype html><title>framer</title><iframe src="{src}"></iframe>'.encode()
        return f"http://127.0.0.1:{server.server_port}{path}"

    yield url
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/ui", "/docs", "/redoc"])
def test_no_other_page_may_frame_a_page(
    loopback_page: Callable[..., Visit], vectors_served: LiveServer, framer: Callable[[str], str], path: str
) -> None:
    """Clickjacking: a page of another origin that frames the service's page gets nothing shown."""
    visit = loopback_page(framer(f"{vectors_served.url}{path}"))
    (frame,) = visit.page.frames[1:]
    frame.wait_for_load_state()
    # refused: Chromium shows its error page in the frame instead of the service's page
    assert frame.url.startswith("chrome-error://"), frame.url
