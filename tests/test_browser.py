"""The browser fixture itself (tests/browser.py): it skips without chromium (fails under CI),
and it sees, refuses and reports a request that leaves loopback, so a page that loads something
from elsewhere cannot pass the browser tests' "only the service" check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests import browser
from tests.browser import Visit, is_loopback


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/ui", True),
        ("http://localhost/v1/layout", True),
        ("http://[::1]:9/x", True),
        ("https://cdn.example.com/lib.js", False),
        ("http://127.0.0.1.example.com/", False),
        ("data:,", False),
    ],
)
def test_only_loopback_counts_as_loopback(url: str, expected: bool) -> None:
    assert is_loopback(url) is expected


def test_without_chromium_the_browser_tests_skip_and_under_ci_they_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        browser.require_chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the browser tests"):
        browser.require_chromium()


def test_a_request_off_loopback_is_refused_and_reported(loopback_page: Callable[..., Visit]) -> None:
    html = (
        '<img src="https://cdn.example.com/logo.png" onerror="window.imgDone = true">'
        '<script>fetch("http://127.0.0.1:9/api").catch(() => {}).finally(() => { window.fetchDone = true; });'
        "</script>"
    )
    visit = loopback_page("data:text/html," + quote(html))
    visit.page.wait_for_function("() => window.imgDone && window.fetchDone")
    assert "https://cdn.example.com/logo.png" in visit.blocked
    assert "http://127.0.0.1:9/api" not in visit.blocked  # loopback goes through (and fails: nobody there)
    outside = visit.outside("http://127.0.0.1:9")
    assert outside == ["https://cdn.example.com/logo.png"]
    assert visit.count("GET", "/api") == 1
