"""A pod from the chart's GPU values on a node without a usable GPU still becomes ready.

The chart is rendered with ``ci/gpu-values.yaml``; the service is started for real on loopback
with the ``ESP_*`` environment of the rendered ConfigMap (and the rendered registry file), as
the container would be. Without CUDA here, ``auto`` must skip ``cupy`` with its reason in the
log and serve from a CPU backend: ``/readyz`` 200, searches answered.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench.live_server import start_server
from deploy.chart import documents, render, scenario_values
from esp_retrieval.service.engine import AUTO_ORDER
from esp_retrieval.service.engine.cupy_backend import cuda_unavailable_reason

# set by the harness itself (loopback address, a free port, the test's bundle)
_HARNESS = {"ESP_HOST", "ESP_PORT", "ESP_BUNDLE"}


def _rendered(values: dict) -> tuple[dict[str, str], str]:
    """(ConfigMap env, registry file text) of the chart rendered with ``values``."""
    objs = {(d["kind"], d["metadata"]["name"]): d for d in documents(render(values))}
    env = objs[("ConfigMap", "esp-retrieval-env")]["data"]
    ((_, registry),) = objs[("ConfigMap", "esp-retrieval-registry")]["data"].items()
    return env, registry


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="CUDA is available: cupy starts here")
@pytest.mark.live  # esp serve, started here
@pytest.mark.slow
def test_gpu_values_on_a_cpu_node_start_a_cpu_backend_and_say_why(tiny_bundle: Path, tmp_path: Path) -> None:
    env, registry_text = _rendered(scenario_values("gpu"))
    assert env["ESP_BACKEND"] == "auto" and env["ESP_PRECISION"] == "float16"
    registry = tmp_path / "registry.yaml"
    registry.write_text(registry_text, encoding="utf-8")
    settings = {
        key.removeprefix("ESP_").lower(): value
        for key, value in env.items()
        if key not in _HARNESS and key != "ESP_REGISTRY"
    }
    expected = next(name for name in AUTO_ORDER[env["ESP_PRECISION"]] if name != "cupy")
    # a generous wait for readiness (torch, the encoder and the warm-up on a shared 2-core machine)
    log_path = tmp_path / "server.log"
    with start_server(tiny_bundle, log_path, settings=settings, registry=registry, ready_timeout=300) as server:
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json()["backend"] == expected  # the first CPU backend of auto's float16 order
        res = httpx.post(
            f"{server.url}/v1/search",
            json={"queries": [{"text": "how to cook rice"}], "k": 3, "operating_point": "entity_heavy"},
            timeout=30,
        )
        assert res.status_code == 200, res.text
        body = res.json()
        assert body["backend"] == expected and len(body["results"][0]["hits"]) == 3
        log = server.log()
    reason = cuda_unavailable_reason()
    assert reason is not None
    assert f"engine backend skipped: {reason}" in log  # why the GPU backend was not used
    assert f"engine backend {expected} started (precision float16" in log
    assert "query encoder on cpu" in log
