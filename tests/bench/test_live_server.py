"""bench.live_server's failure paths (the happy path is every live test): a process that dies
or never gets ready is reported with its log, and is not left running."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.live_server import REFUSE_ENV, child_env, free_port, spawn


@pytest.mark.live
def test_a_process_that_exits_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "print('listening? no: bad config'); raise SystemExit(3)"]
    proc = spawn("dying", cmd, tmp_path / "logs" / "dying.log", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RuntimeError, match=r"(?s)dying exited with 3:.*bad config"):
        proc.wait_until(lambda: False, timeout=60, what="never")
    assert proc.log().strip() == "listening? no: bad config"


@pytest.mark.live
def test_a_process_never_ready_times_out_and_stop_ends_it(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import time; print('still starting', flush=True); time.sleep(60)"]
    with spawn("slow", cmd, tmp_path / "slow.log", "http://127.0.0.1:1") as proc:
        proc.wait_until(lambda: "still starting" in proc.log(), timeout=60, what="output")
        with pytest.raises(TimeoutError, match=r"(?s)slow: ready not true after 0s:.*still starting"):
            proc.wait_until(lambda: False, timeout=0.3, what="ready")
        assert proc.proc.poll() is None
    assert proc.proc.poll() is not None  # the context manager stopped it


def test_child_env_drops_inherited_esp_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESP_BACKEND", "torch")
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    env = child_env({"ESP_THREADS": "1"})
    assert "ESP_BACKEND" not in env and env["ESP_THREADS"] == "1"
    assert env["PYTHONPATH"].endswith("elsewhere") and env["PYTHONPATH"] != "elsewhere"


def test_spawn_refuses_while_the_suite_says_no_live_test_runs(tmp_path: Path) -> None:
    # this test has no ``live`` marker: tests/conftest.py has set REFUSE_ENV around it
    cmd = [sys.executable, "-c", "raise SystemExit(0)"]
    with pytest.raises(RuntimeError, match=r"not started: .*test_spawn_refuses.* lacks the 'live' marker"):
        spawn("refused", cmd, tmp_path / "refused.log", "http://127.0.0.1:1")
    assert not (tmp_path / "refused.log").exists()


@pytest.mark.live
def test_a_live_test_may_spawn() -> None:
    import os

    assert REFUSE_ENV not in os.environ
