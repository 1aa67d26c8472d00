"""esp_retrieval.service.polling.Poller: checks repeat until stopped, a failing check does not end the loop,
the first check runs at once or after one interval, start is idempotent and stop waits."""

import asyncio
import logging

import pytest

from esp_retrieval.service.polling import Poller


def _run_until(poller: Poller, calls: list[str], count: int, seconds: float) -> None:
    async def scenario() -> None:
        poller.start(seconds)
        poller.start(seconds)  # idempotent: still one task
        try:
            for _ in range(2000):  # a deadline, not a timing assertion
                if len(calls) >= count:
                    break
                await asyncio.sleep(0.005)
        finally:
            await poller.stop()
        assert not poller.running
        await poller.stop()  # stopping twice is harmless

    asyncio.run(scenario())


def test_a_failing_check_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    async def check() -> None:
        calls.append("check")
        if len(calls) == 1:
            raise RuntimeError("bad poll")

    poller = Poller("test-poller", check, what="test check", check_first=True)
    with caplog.at_level(logging.ERROR, logger="esp_retrieval.service.polling"):
        _run_until(poller, calls, 3, 0.001)
    assert len(calls) >= 3
    assert [r.getMessage() for r in caplog.records] == ["test check failed"]


@pytest.mark.parametrize("check_first", [True, False])
def test_the_first_check_runs_at_once_only_when_asked(check_first: bool) -> None:
    calls: list[str] = []

    async def check() -> None:
        calls.append("check")

    async def scenario() -> list[str]:
        poller = Poller("test-poller", check, what="test check", check_first=check_first)
        poller.start(3600.0)  # one interval is far beyond this test
        for _ in range(20):
            await asyncio.sleep(0)
        seen = list(calls)
        await poller.stop()
        return seen

    assert asyncio.run(scenario()) == (["check"] if check_first else [])
