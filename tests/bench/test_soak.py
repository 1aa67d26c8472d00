"""bench/soak.py --quick: a short soak (peak, 2x overload, reloads, registry changes, the attack
mix) reports one JSON line with no server error and no request lost."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.live_server import SOURCE_ROOT, child_env


@pytest.mark.slow
@pytest.mark.live  # bench/soak.py starts its server
def test_quick_soak_reports_one_line_without_5xx_or_lost_requests() -> None:
    proc = subprocess.run(
        [sys.executable, str(SOURCE_ROOT / "bench" / "soak.py"), "--quick", "--peak-concurrency", "8"],
        capture_output=True, text=True, timeout=900, env=child_env(), check=False,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    result = json.loads(lines[0])
    assert result["count_5xx"] == 0 and result["lost"] == 0, result
    assert result["reloads"] >= 2 and result["reload_failures"] == 0 and result["registry_changes"] >= 1
    assert result["statuses"].get("200", 0) > 0
    attacks = result["attacks"]  # the attack mix ran beside the load, and lost nothing
    assert attacks["lost"] == {}, attacks
    assert set(attacks["statuses"]["slow_connection"]) == {"408"}  # a trickled body never holds a search
    assert set(attacks["statuses"]["expensive"]) <= {"200", "429"}
    assert set(attacks["statuses"]["filter"]) <= {"200", "429"}
    for key in ("answered_per_s", "share_429", "admitted_p99_ms", "unloaded", "rss_mb", "threads"):
        assert key in result
    # the goodput peak: levels of doubling callers, up to the first past the objective
    good = result["goodput_peak"]
    levels = good["levels"]
    assert [lv["concurrency"] for lv in levels] == [2**i for i in range(len(levels))]
    assert all(lv["within_objective"] for lv in levels[:-1])
    within = [lv["answered_per_s"] for lv in levels if lv["within_objective"]]
    assert good["answered_per_s"] == max(within, default=0.0)
    assert good["objective_ms"] == result["latency_budget_ms"]
    assert proc.returncode == 0
