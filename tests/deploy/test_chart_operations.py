"""Chart pieces for operating the service: Ingress, NetworkPolicy, the `helm test` pod (its
script run here against a live server), the preStop drain, and the tracing / log / exposure
values, each rendered offline and checked against what the service reads."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from bench.live_server import LiveServer
from deploy.chart import documents, is_hook, render, scenario_values
from esp_retrieval.service.config import Settings


def objects(values: dict[str, Any] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(render(values))}


def container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (c,) = objects(values)[("Deployment", "esp-retrieval")]["spec"]["template"]["spec"]["containers"]
    return c


def test_ingress_and_network_policy_are_off_by_default_and_route_to_the_http_port() -> None:
    kinds = {k for k, _ in objects()}
    assert "Ingress" not in kinds and "NetworkPolicy" not in kinds
    objs = objects(scenario_values("network"))
    ing = objs[("Ingress", "esp-retrieval")]["spec"]
    assert ing["ingressClassName"] == "nginx" and ing["tls"][0]["secretName"] == "search-tls"
    (rule,) = ing["rules"]
    (path,) = rule["http"]["paths"]
    assert rule["host"] == "search.example.internal"
    assert path["backend"]["service"] == {"name": "esp-retrieval", "port": {"name": "http"}}
    pol = objs[("NetworkPolicy", "esp-retrieval")]["spec"]
    assert pol["policyTypes"] == ["Ingress"]
    assert pol["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "esp-retrieval"
    (allowed,) = pol["ingress"]
    assert allowed["ports"] == [{"port": "http", "protocol": "TCP"}]
    namespaces = [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for p in allowed["from"] if "namespaceSelector" in p]
    assert namespaces == ["ingress-nginx", "monitoring"]
    assert {"podSelector": {}} in allowed["from"]  # the release's own namespace
    closed = objects({"networkPolicy": {"enabled": True, "allowSameNamespace": False}})
    assert closed[("NetworkPolicy", "esp-retrieval")]["spec"]["ingress"] == []  # no peer: nobody


def test_the_helm_test_pod_searches_once(vectors_served: LiveServer) -> None:
    (pod,) = [d for d in documents(render()) if is_hook(d)]
    assert pod["kind"] == "Pod" and pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ESP_URL"] == "http://esp-retrieval:8000"  # the Service's name and port
    assert c["command"][:2] == ["python", "-c"]
    # the pod's own script against a live server: it passes, and fails when there is no service
    ok = subprocess.run([sys.executable, "-c", c["command"][2]], env={"ESP_URL": vectors_served.url},
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0 and ok.stdout.startswith("search ok:"), ok.stderr
    down = subprocess.run([sys.executable, "-c", c["command"][2]], env={"ESP_URL": "http://127.0.0.1:9"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert down.returncode != 0
    assert not [d for d in documents(render({"helmTest": {"enabled": False}})) if is_hook(d)]


def test_prestop_drains_before_sigterm_within_the_grace_period() -> None:
    c = container()
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    grace = objects()[("Deployment", "esp-retrieval")]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > 5 + 15  # sleep, then uvicorn's 15 s graceful shutdown (esp serve)
    assert "lifecycle" not in container({"preStopSleepSeconds": 0})


@pytest.mark.parametrize("scenario", ["default", "network"])
def test_operation_values_become_settings_the_service_reads(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = scenario_values(scenario)
    env = objects(values)[("ConfigMap", "esp-retrieval-env")]["data"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.log_format == "json"
    if scenario == "default":
        assert (settings.tracing, settings.exposure_log) == (False, "off")
    else:
        assert settings.tracing and settings.trace_sample_ratio == 0.1
        assert settings.otlp_endpoint == "http://otel-collector.observability:4318/v1/traces"
        assert settings.exposure_log == "file" and str(settings.exposure_log_path).startswith("/tmp/")
        assert settings.exposure_sample_rate == 0.5 and settings.exposure_hash_unit_id
