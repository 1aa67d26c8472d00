"""A real headless browser for tests (a plugin of ``tests/conftest.py``): Debian's ``chromium``
driven by Playwright for Python.

Playwright's own browser download (``playwright install``) is never used: the browser is the
system package at :data:`CHROMIUM`, which ``.ci/run`` installs (``apt-get install chromium``).
Without it the browser tests skip, saying so; under CI (``CI`` set) they fail instead, so a CI
run cannot pass without having run them.

Fixtures:

``chromium_browser``  module-scoped: one browser per test module, launched with :data:`FLAGS`
                      (Playwright gives every launch a fresh temporary user-data-dir).
``loopback_page``     ``open(url) -> Visit``: a new browser context (no shared cookies or cache)
                      and page, loaded at ``url``. Every request the page makes is recorded in
                      ``Visit.requests``; requests to anything but loopback are refused (and
                      listed in ``Visit.blocked``), and host names other than loopback do not
                      even resolve (``--host-resolver-rules``): the network is off.
                      ``Visit.errors`` collects uncaught page errors, ``console_errors``
                      the console's (failed loads, 4xx answers included).

    def test_page(loopback_page, served):
        visit = loopback_page(f"{served.url}/ui")
        visit.page.get_by_label("Query").fill("robert gray")
        assert visit.outside(served.url) == []
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Request, Route

CHROMIUM = Path("/usr/bin/chromium")

#: Chromium flags: headless, no sandbox (root in CI), and no traffic of the browser's own
#: (updates, sync, field trials, QUIC) that would leave the machine or differ between runs.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE [::1]",
)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

#: Playwright's per-action wait (ms): generous, the CPU is often shared with other test processes.
TIMEOUT_MS = 60_000

VIEWPORT = {"width": 1360, "height": 1000}


def missing_chromium_reason() -> str | None:
    """Why the browser tests cannot run here, or ``None`` when they can."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium; .ci/run does)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -r requirements.txt)"
    return None


def require_chromium() -> None:
    """Skip the calling test when chromium (or Playwright) is absent; fail instead under CI."""
    reason = missing_chromium_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {reason}")
    pytest.skip(reason)


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in {"http", "https", "ws", "wss"} and parts.hostname in LOOPBACK_HOSTS


@dataclass
class Visit:
    """One page in its own browser context, and what it asked the network for."""

    page: Page
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, url) of every request
    blocked: list[str] = field(default_factory=list)  # refused: not on loopback
    errors: list[str] = field(default_factory=list)  # uncaught exceptions in the page
    console_errors: list[str] = field(default_factory=list)  # console.error, failed loads (4xx too)

    @property
    def requests(self) -> list[str]:
        """Every URL the page requested, in order."""
        return [url for _, url in self.calls]

    def outside(self, origin: str) -> list[str]:
        """Requested URLs not served by ``origin`` (``http://host:port``); ``data:`` URLs are
        the page's own bytes and do not count."""
        base = origin.rstrip("/") + "/"
        return [u for u in self.requests if not (u.startswith(base) or u == origin or u.startswith("data:"))]

    def count(self, method: str, path: str) -> int:
        """How many requests went to ``path`` (query string ignored) with ``method``."""
        return sum(1 for m, u in self.calls if m == method and urlsplit(u).path == path)


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Browser]:
    # Module scope: Playwright's sync API keeps an asyncio loop running in this thread while it
    # is open, so a session-wide browser would make every later asyncio.run() in the suite fail.
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=list(FLAGS), timeout=TIMEOUT_MS * 2
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def loopback_page(chromium_browser: Browser) -> Iterator[Callable[..., Visit]]:
    """``open(url, **context_options) -> Visit`` (see the module docstring); closed after the test."""
    contexts: list[Any] = []

    def open_page(url: str, **context_options: Any) -> Visit:
        options: dict[str, Any] = {"viewport": VIEWPORT, "service_workers": "block", **context_options}
        context = chromium_browser.new_context(**options)
        contexts.append(context)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        visit = Visit(page)

        def on_request(request: Request) -> None:
            visit.calls.append((request.method, request.url))

        def route(route: Route) -> None:
            if is_loopback(route.request.url):
                route.continue_()
            else:
                visit.blocked.append(route.request.url)
                route.abort("blockedbyclient")

        page.on("request", on_request)
        page.on("pageerror", lambda exc: visit.errors.append(f"page error: {exc}"))
        page.on("console", lambda msg: visit.console_errors.append(msg.text) if msg.type == "error" else None)
        context.route("**/*", route)
        page.goto(url)
        return visit

    yield open_page
    for context in contexts:
        context.close()
