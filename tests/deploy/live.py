"""Start real processes on loopback for the deployment tests: ``esp serve`` and Prometheus.

Each runs in its own temp directory with its output in a log file (quoted when a wait fails),
is bounded in time, and is stopped (terminate, then kill) by the fixture that started it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from deploy.files import REPO_ROOT


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self, tail: int = 3000) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-tail:]

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``check`` every 0.2 s until it is true; fail with the log after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if check():
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {what} not true after {timeout:.0f}s:\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _spawn(name: str, cmd: list[str], workdir: Path, url: str, env: dict[str, str] | None = None) -> Process:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    return Process(name, url, proc, log_path)


def start_service(bundle: Path, registry: dict[str, Any], workdir: Path, ready_timeout: float = 120.0) -> Process:
    """``esp serve`` (the console script's module) on a free loopback port; returns once /readyz is 200."""
    registry_path = workdir / "registry.yaml"
    registry_path.write_text(yaml.safe_dump(registry), encoding="utf-8")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESP_")}
    env.update({"ESP_BACKEND": "numpy", "ESP_THREADS": "1", "ESP_REGISTRY": str(registry_path),
                "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)})
    cmd = [sys.executable, "-m", "subspace.cli", "serve", "--bundle", str(bundle),
           "--host", "127.0.0.1", "--port", str(port)]
    service = _spawn("esp-serve", cmd, workdir, f"http://127.0.0.1:{port}", env)
    try:
        service.wait_until(lambda: httpx.get(f"{service.url}/readyz", timeout=2).status_code == 200,
                           ready_timeout, "/readyz == 200")
    except BaseException:
        service.stop()
        raise
    return service


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
    prom = _spawn("prometheus", cmd, workdir, f"http://127.0.0.1:{port}")
    try:
        prom.wait_until(lambda: httpx.get(f"{prom.url}/-/ready", timeout=2).status_code == 200, 30, "/-/ready")
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
