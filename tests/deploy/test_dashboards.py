"""Dashboards as code: the committed JSON is what deploy/dashboards.py generates, every query
parses with promtool, and the panels cover what operators need to watch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from deploy import dashboards
from deploy.files import drift
from esp_retrieval.service.metrics import METRIC_NAMES
from tests.deploy.support import (
    DASHBOARD_FILES,
    dashboard_panels,
    dashboard_targets,
    recording_rules_file,
    series_names,
    substitute,
    tool,
)

PROMTOOL = tool("promtool")


def test_committed_json_matches_the_generator() -> None:
    problems = drift(dashboards.DASHBOARDS_DIR, dashboards.build(), "*.json")
    assert not problems, "\n".join([*problems, "run: python -m deploy.dashboards"])


def test_drift_is_detected(tmp_path: Path) -> None:
    files = dashboards.build()
    (tmp_path / "esp-retrieval.json").write_text(files["esp-retrieval.json"].replace("p99", "p98"))
    (tmp_path / "old.json").write_text("{}")
    problems = drift(tmp_path, files, "*.json")
    assert any("differs" in p for p in problems) and any("stale" in p for p in problems)


def test_every_panel_has_queries_on_the_prometheus_variable() -> None:
    assert DASHBOARD_FILES
    for panel in dashboard_panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert 'namespace=~"$namespace"' in target["expr"] and 'job=~"$job"' in target["expr"]
    titles = [p["title"] for p in dashboard_panels()]
    assert len(titles) == len(set(titles))


def test_dashboard_covers_the_issue() -> None:
    """Traffic and p50/p95/p99 by experiment and arm, engine and encode time, batch size, queue
    depth, errors by status, weights per subspace, index size, bundle version, reloads by result."""
    exprs = {title: " ".join(t["expr"] for t in p["targets"])
             for p in dashboard_panels() for title in [p["title"]]}
    by_arm = exprs["Latency by experiment and arm"]
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le, experiment, arm)" in by_arm
    assert "by (experiment, arm)" in exprs["Queries by experiment and arm"]
    assert "esp_engine_duration_seconds_bucket" in exprs["Engine time by backend"]
    assert "esp_encode_duration_seconds_bucket" in exprs["Query encoding time"]
    assert "esp_batch_size" in exprs["Batch size"]
    assert "esp_queue_depth" in exprs["Queue depth"] and "esp_queue_capacity" in exprs["Queue depth"]
    assert "sum by (status)" in exprs["Errors by status"]
    assert "by (subspace)" in exprs["Weights in use per subspace"]
    assert "esp_index_documents" in exprs["Documents in index"]
    assert "version" in exprs["Bundle version"]
    reloads = exprs["Reloads by result"]
    assert "esp_registry_reloads_total" in reloads and "esp_bundle_reloads_total" in reloads


def test_queries_use_only_metric_names_the_service_defines() -> None:
    histogram_series = {f"{n}{s}" for n in METRIC_NAMES for s in ("_bucket", "_sum", "_count")}
    for _, title, expr in dashboard_targets():
        used = series_names(expr)
        assert used, title
        assert used <= set(METRIC_NAMES) | histogram_series, (title, used - set(METRIC_NAMES))


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_every_query_passes_promtool(tmp_path: Path) -> None:
    targets = dashboard_targets()
    variables = [v["query"] for path in DASHBOARD_FILES
                 for v in json.loads(path.read_text())["templating"]["list"] if v["type"] == "query"]
    # label_values(selector, label) is Grafana's; its selector must be valid PromQL.
    selectors = [q.removeprefix("label_values(").rsplit(",", 1)[0] for q in variables]
    exprs = [substitute(expr) for _, _, expr in targets] + [substitute(s) for s in selectors]
    rules = recording_rules_file(exprs, tmp_path / "queries.yaml")
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    rules = recording_rules_file(["sum by (le (rate(esp_batch_size_bucket[1m]))"], tmp_path / "bad.yaml")
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
