"""Alert rules: promtool checks and unit-tests the rules file the chart's PrometheusRule embeds."""

from __future__ import annotations

import subprocess

import pytest

from esp_retrieval.service.metrics import METRIC_NAMES
from tests.deploy.support import ALERT_TESTS, RULES_FILE, alert_rules, series_names, tool

PROMTOOL = tool("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)"
)
#: What the issue asks the alerts to cover -> the alert names that do.
REQUIRED = {
    "error rate": "ESPHighErrorRate",
    "latency": "ESPHighSearchLatency",
    "not ready": "ESPNotReady",
    "registry reload failures": "ESPRegistryReloadFailing",
    "bundle reload failures": "ESPBundleReloadFailing",
    "queue saturation": "ESPQueueSaturated",
    "searches refused by admission": "ESPSearchesRefused",
}


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


@needs_promtool
def test_rules_file_passes_promtool_check() -> None:
    result = run_promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


@needs_promtool
def test_alert_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_alert_unit_tests_can_fail(tmp_path) -> None:
    """A wrong expectation makes promtool fail, so a pass above means something."""
    broken = ALERT_TESTS.read_text(encoding="utf-8").replace("severity: critical", "severity: info", 1)
    copy = ALERT_TESTS.parent / f".{tmp_path.name}.test.yaml"  # beside the original: same relative rule path
    copy.write_text(broken, encoding="utf-8")
    try:
        assert run_promtool("test", "rules", str(copy)).returncode != 0
    finally:
        copy.unlink()


def test_every_required_alert_exists_and_is_tested() -> None:
    names = {r["alert"] for r in alert_rules()}
    assert set(REQUIRED.values()) <= names
    tests = ALERT_TESTS.read_text(encoding="utf-8")
    for name in names:
        assert f"alertname: {name}\n" in tests, f"{name} has no promtool unit test"


def test_alerts_are_actionable() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_alerts_use_only_exported_metric_names() -> None:
    histogram_series = {f"{n}{s}" for n in METRIC_NAMES for s in ("_bucket", "_sum", "_count")}
    for rule in alert_rules():
        used = series_names(rule["expr"])
        assert used, rule["alert"]
        assert used <= set(METRIC_NAMES) | histogram_series, (rule["alert"], used)
