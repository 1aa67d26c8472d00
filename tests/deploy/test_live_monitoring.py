"""Against a real running service: every metric a dashboard or alert reads is exported, and a
real Prometheus on loopback scrapes it and answers the dashboards' queries (``make monitor-check``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from esp_retrieval.service.metrics import METRIC_NAMES
from tests.deploy.live import Process, query, start_prometheus, start_service
from tests.deploy.support import (
    alert_rules,
    dashboard_targets,
    exposed_series,
    series_names,
    substitute,
    tool,
)

pytestmark = pytest.mark.live  # esp serve and Prometheus, started here

EXPERIMENT = "ab"
REGISTRY = {
    "version": 1,
    "experiments": {
        EXPERIMENT: {
            "salt": "monitor-check",
            "arms": [
                {"name": "control", "share": 0.5, "operating_point": "balanced"},
                {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy"},
            ],
        }
    },
}
#: Grafana variables for queries against this Prometheus: short windows, 1 s scrapes.
VARIABLES = {"$__rate_interval": "10s", "$namespace": ".*", "$job": ".*", "$experiment": ".*"}


def send_traffic(url: str, n: int = 6) -> None:
    """Searches through both experiment arms, plus one request the service must refuse (422)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(n):
            body = {"queries": [{"text": f"what is query number {i}"}], "k": 3,
                    "experiment": EXPERIMENT, "unit_id": f"user-{i}"}
            assert client.post("/v1/search", json=body).status_code == 200
        bad = client.post("/v1/search", json={"queries": [{"text": "x"}], "weights": {"nope": 1.0}})
        assert bad.status_code == 422


@pytest.fixture(scope="module")
def service(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = start_service(tiny_bundle, REGISTRY, tmp_path_factory.mktemp("esp-serve"))
    try:
        send_traffic(proc.url)
        yield proc
    finally:
        proc.stop()


@pytest.mark.slow  # the module's service fixture: tiny bundle + `esp serve` start, ~10-60 s
def test_every_metric_used_by_dashboards_and_alerts_is_exported(service: Process) -> None:
    exposition = httpx.get(f"{service.url}/metrics", timeout=10).text
    exported = exposed_series(exposition)
    used = {name for _, _, expr in dashboard_targets() for name in series_names(expr)}
    used |= {name for rule in alert_rules() for name in series_names(rule["expr"])}
    assert used and not used - exported.keys(), sorted(used - exported.keys())
    for name in METRIC_NAMES:  # esp_retrieval/service/metrics.py's list is what the server really serves
        assert name in exported or f"{name}_bucket" in exported, name


@pytest.mark.slow
@pytest.mark.skipif(tool("prometheus") is None,
                    reason="prometheus not installed (Debian package `prometheus`; .ci/run installs it)")
def test_prometheus_scrapes_the_service_and_answers_dashboard_queries(
    service: Process, tmp_path: Path
) -> None:
    binary = tool("prometheus")
    assert binary is not None
    prom = start_prometheus(binary, [service.url.removeprefix("http://")], tmp_path)
    try:
        prom.wait_until(lambda: [float(r["value"][1]) for r in query(prom, 'up{job="esp-retrieval"}')] == [1.0],
                        30, "the service target is up")
        send_traffic(service.url)  # after the first scrapes, so rates see the increase
        panels: dict[str, list[str]] = {}
        for _, title, expr in dashboard_targets():
            panels.setdefault(title, []).append(substitute(expr, VARIABLES))

        def search_rate() -> list[dict]:
            (expr,) = panels["Requests by route and status"]
            return [r for r in query(prom, expr)
                    if r["metric"].get("route") == "/v1/search" and r["metric"].get("status") == "200"
                    and float(r["value"][1]) > 0]

        prom.wait_until(lambda: bool(search_rate()), 30, "a non-zero /v1/search rate")
        (ready,) = query(prom, panels["Ready pods"][0])
        assert float(ready["value"][1]) == 1.0
        (docs,) = query(prom, panels["Documents in index"][0])
        assert float(docs["value"][1]) > 0
        arms = {r["metric"]["arm"] for r in query(prom, panels["Queries by experiment and arm"][0])}
        assert arms <= {"control", "treatment"} and arms
        errors = {r["metric"]["status"] for r in query(prom, panels["Errors by status"][0])}
        assert "422" in errors
        # Every other query runs without an error in a real Prometheus (empty results allowed:
        # a fresh service has no reloads, for instance).
        for exprs in panels.values():
            for expr in exprs:
                query(prom, expr)
    finally:
        prom.stop()
