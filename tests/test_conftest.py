"""The suite's own rules (tests/conftest.py, tests/live_fixtures.py): markers follow the fixtures a
test uses, and the Makefile's tiers select by marker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_MARKERS

ROOT = Path(__file__).resolve().parents[1]


def test_every_collected_test_using_a_marked_fixture_carries_its_marker(request: pytest.FixtureRequest) -> None:
    for item in request.session.items:  # every test this run selected
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                assert item.get_closest_marker(marker) is not None, (item.nodeid, marker)


def test_the_marked_fixtures_exist() -> None:
    from tests import browser, live_fixtures

    assert all(hasattr(live_fixtures, name) or hasattr(browser, name) for name in FIXTURE_MARKERS)


def test_the_markers_are_registered_and_the_fast_tier_leaves_them_out() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    fast = re.search(r"^FAST := (.+)$", makefile, re.M)
    assert fast is not None
    for marker in ("live", "browser", "slow", "gpu"):
        assert re.search(rf'^    "{marker}: ', pyproject, re.M), marker
        assert f"not {marker}" in fast.group(1), marker
    assert "--strict-markers" in pyproject


def test_the_readme_keeps_no_test_count() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"\b\d[\d,]* (tests|passed|skipped)\b", readme)
