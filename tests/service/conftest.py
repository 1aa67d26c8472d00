"""Fast-path fixture: ``taken`` counts the requests the search fast path answered."""

from __future__ import annotations

from typing import Any

import pytest

from service import fastpath


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per request the fast path answered."""
    calls: list[int] = []
    real = fastpath.run_search

    async def counted(*args: Any) -> Any:
        calls.append(1)
        return await real(*args)

    monkeypatch.setattr(fastpath, "run_search", counted)
    return calls
