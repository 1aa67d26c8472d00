"""Start real processes on loopback for the deployment tests: ``esp serve`` and Prometheus.

Each runs in its own temp directory with its output in a log file (quoted when a wait fails),
is bounded in time, and is stopped (terminate, then kill) by the fixture that started it; the
harness is :mod:`bench.live_server`, shared with the service tests and bench/http_load.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.live_server import LiveProcess as Process
from bench.live_server import free_port, spawn, start_server

__all__ = ["Process", "query", "start_prometheus", "start_service"]


def start_service(bundle: Path, registry: dict[str, Any], workdir: Path, ready_timeout: float = 120.0) -> Process:
    """``esp serve`` (the console script's module) on a free loopback port; returns once /readyz is 200."""
    registry_path = workdir / "registry.yaml"
    registry_path.write_text(yaml.safe_dump(registry), encoding="utf-8")
    return start_server(bundle, workdir / "esp-serve.log", settings={"backend": "numpy", "threads": 1},
                        registry=registry_path, ready_timeout=ready_timeout)


def start_prometheus(binary: str, targets: list[str], workdir: Path, scrape_interval: str = "1s") -> Process:
    """Prometheus on a free loopback port scraping ``targets`` (host:port), its TSDB in ``workdir``."""
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [{"job_name": "esp-retrieval", "static_configs": [{"targets": targets}]}],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    cmd = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    prom = spawn("prometheus", cmd, workdir / "prometheus.log", f"http://127.0.0.1:{port}")
    try:
        prom.wait_until(lambda: httpx.get(f"{prom.url}/-/ready", timeout=2).status_code == 200, 30, "/-/ready",
                        interval=0.2)
    except BaseException:
        prom.stop()
        raise
    return prom


def query(prom: Process, expr: str) -> list[dict[str, Any]]:
    """Instant query through the Prometheus HTTP API; raises on an API error."""
    response = httpx.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    if response.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"query failed ({response.status_code}): {expr}\n{body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
