"""The Helm chart renders (helm-python-sdk, Helm's own engine) for every scenario, every object
validates strictly against the Kubernetes schemas, and the values do what values.yaml says."""

from __future__ import annotations

import argparse
import base64
import json
import re
from typing import Any

import helm_python
import pytest
import yaml

from deploy.chart import CHART_DIR, documents, is_hook, render, scenario_values, scenarios
from esp_retrieval.cli import fetch_bundle
from esp_retrieval.service.engine import AUTO_ORDER
from esp_retrieval.service.tuning.loader import parse_text
from esp_retrieval.service.tuning.model import Registry
from esp_retrieval.subspace.layout import SubspaceLayout
from tests.deploy.support import DASHBOARD_FILES, KUBE_VERSIONS, RULES_FILE, validate_object

SCENARIOS = ["default", *scenarios()]
LAYOUT = SubspaceLayout.from_dims({"semantic": 256, "entity": 96, "intent": 32})


def objects(values: dict[str, Any] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object of a rendering."""
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(render(values))}


def deployment(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (dep,) = [d for (kind, _), d in objects(values).items() if kind == "Deployment"]
    return dep


def container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (c,) = deployment(values)["spec"]["template"]["spec"]["containers"]
    return c


def env_config(values: dict[str, Any] | None = None) -> dict[str, str]:
    return objects(values)[("ConfigMap", "esp-retrieval-env")]["data"]


def checksum(values: dict[str, Any] | None = None) -> dict[str, str]:
    ann = deployment(values)["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in ann.items() if k.startswith("checksum/")}


def test_ci_scenarios_exist() -> None:
    assert {"cpu", "gpu", "monitoring"} <= set(scenarios())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_validates_strictly(scenario: str) -> None:
    docs = documents(render(scenario_values(scenario)))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= kinds
    for doc in docs:
        for version in KUBE_VERSIONS:
            validate_object(doc, version)
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "esp-retrieval"
        assert labels["app.kubernetes.io/instance"] == "esp-retrieval"
        assert labels["helm.sh/chart"] == "esp-retrieval-0.1.0"


def test_validation_is_strict() -> None:
    """The checkers reject what a cluster would reject: an unknown field, a bad CRD field."""
    import jsonschema
    import kubernetes_validate

    dep = deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(dep, KUBE_VERSIONS[-1])
    rule = objects(scenario_values("monitoring"))[("PrometheusRule", "esp-retrieval")]
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(rule, KUBE_VERSIONS[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_is_clean(scenario: str) -> None:
    report = helm_python.lint(CHART_DIR, scenario_values(scenario), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def test_defaults_keep_optional_pieces_off() -> None:
    kinds = {kind for (kind, _), doc in objects().items() if not is_hook(doc)}  # `helm test` pod aside
    assert kinds == {"ConfigMap", "Deployment", "Service", "ServiceAccount"}  # one pod: no budget
    c = container()
    # sized from bench/serve_memory.py's demo-shaped bundle: 1.07 GB peak across a reload
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "1280Mi"}, "limits": {"memory": "1536Mi"}}
    assert c["image"] == "ghcr.io/esp-retrieval/esp-retrieval:0.1.0"  # image.tag defaults to appVersion
    assert not any(e["name"] == "ESP_ADMIN_TOKEN" for e in c["env"])  # no token: admin routes off


def _documented_paths(text: str) -> set[tuple[str, ...]]:
    """Key paths of values.yaml that have a comment on the line right above them."""
    documented: set[tuple[str, ...]] = set()
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in text.splitlines():
        match = re.match(r"^(\s*)([A-Za-z0-9_.-]+):", line)
        if match:
            indent = len(match.group(1))
            stack = [(i, k) for i, k in stack if i < indent]
            stack.append((indent, match.group(2)))
            if previous.lstrip().startswith("#"):
                documented.add(tuple(k for _, k in stack))
        if line.strip():
            previous = line
    return documented


def _leaves(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in values.items():
        path = (*prefix, key)
        out.extend(_leaves(value, path) if isinstance(value, dict) and value else [path])
    return out


def test_values_file_documents_every_key() -> None:
    """prometheus-community habit: every value has a comment (on it or on the object holding it)."""
    text = (CHART_DIR / "values.yaml").read_text(encoding="utf-8")
    documented = _documented_paths(text)
    undocumented = [
        ".".join(path) for path in _leaves(yaml.safe_load(text))
        if not any(path[:n] in documented for n in range(1, len(path) + 1))
    ]
    assert not undocumented
    assert ("gpu", "count") in documented and ("resources",) in documented


def test_schema_rejects_bad_values() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(scenario_values("gpu"))
        for bad in (
            {"gpu": {"count": 2}},  # one process per GPU
            {"config": {"backend": "gpu"}},
            {"bundle": {"source": "s3"}},
            {"replicas": 3},  # a typo of replicaCount
            {"config": {"precision": "int8"}},
        ):
            with pytest.raises(helm_python.HelmValuesError):
                chart.validate_schema(bad)


def test_pvc_source_needs_a_claim() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="claimName"):
        render({"bundle": {"source": "pvc"}})


def test_gpu_pods_get_one_gpu_the_cuda_image_and_cupy_with_a_cpu_fallback() -> None:
    values = scenario_values("gpu")
    c = container(values)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["resources"]["limits"]["memory"] == values["resources"]["limits"]["memory"]  # merged, not replaced
    assert c["image"].endswith(":0.1.0-cuda")
    env = env_config(values)
    # auto: cupy first, then CPU backends (a pod on a node without a usable GPU still starts)
    assert env["ESP_BACKEND"] == "auto"
    order = AUTO_ORDER[env["ESP_PRECISION"]]
    assert order[0] == "cupy" and len(order) > 1
    assert c["command"][:2] == ["esp", "serve"]  # one process per pod, so one per GPU
    tolerations = deployment(values)["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert "nvidia.com/gpu" not in json.dumps(container(scenario_values("cpu")).get("resources", {}))


def test_probes_hit_healthz_and_readyz() -> None:
    c = container()
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_registry_is_a_directory_mount_the_service_reads() -> None:
    dep = deployment()
    c = dep["spec"]["template"]["spec"]["containers"][0]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "registry"]
    assert "subPath" not in mount  # subPath mounts never see ConfigMap updates
    assert env_config()["ESP_REGISTRY"] == mount["mountPath"] + "/registry.yaml"
    (volume,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "registry"]
    assert volume["configMap"]["name"] == "esp-retrieval-registry"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_registry_content_is_accepted_by_the_service(scenario: str) -> None:
    """The ConfigMap's file parses and validates with the service's own registry code."""
    cm = objects(scenario_values(scenario))[("ConfigMap", "esp-retrieval-registry")]
    (name, text), = cm["data"].items()
    registry = Registry.parse(parse_text(text, name), LAYOUT, source=name)
    if scenario in ("cpu", "gpu"):
        assert set(registry.experiments) == {"entity-boost"}


def test_bundle_from_pvc_mounts_the_whole_claim_read_only_and_serves_its_folder() -> None:
    values = scenario_values("cpu")
    dep = deployment(values)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "bundle"]
    assert mount == {"name": "bundle", "mountPath": "/models/bundles", "readOnly": True}  # no subPath
    assert env_config(values)["ESP_BUNDLE"] == "/models/bundles/demo" == c["command"][c["command"].index("--bundle") + 1]
    (volume,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "bundle"]
    assert volume["persistentVolumeClaim"] == {"claimName": "esp-bundles", "readOnly": True}
    assert "bundle" not in json.dumps(deployment()["spec"]["template"]["spec"]["volumes"])  # baked


def _mounted(c: dict[str, Any], path: str) -> bool:
    return any(path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/") for m in c["volumeMounts"])


@pytest.mark.parametrize("doc", ["README.md", "helm/esp-retrieval/README.md"])
def test_the_documented_rollout_path_is_visible_in_a_pod_as_shipped(doc: str) -> None:
    """The registry's bundle.path names a folder the pods can read: with the PVC scenarios the
    claim is mounted whole, so a new folder on it needs no new mount."""
    text = (CHART_DIR.parent.parent / doc).read_text(encoding="utf-8")
    paths = re.findall(r"^\s*path: (/models/\S+)", text, flags=re.M)
    assert paths, f"{doc} documents no rollout path"
    for scenario in ("cpu", "gpu"):
        c = container(scenario_values(scenario))
        for path in paths:
            assert _mounted(c, path), f"{doc}: {path} is not under a mount of the {scenario} pods"


def test_remote_bundle_is_fetched_by_an_init_container_with_credentials_from_a_secret() -> None:
    values = scenario_values("remote")
    remote = values["bundle"]["remote"]
    spec = deployment(values)["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    cache = "/var/cache/esp-bundles"
    assert init["command"] == ["esp", "fetch-bundle", remote["uri"], "--sha256", remote["sha256"], "--cache", cache]
    assert init["envFrom"] == [{"secretRef": {"name": "esp-bundle-credentials"}}]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    (c,) = spec["containers"]
    assert {"secretRef": {"name": "esp-bundle-credentials"}} in c["envFrom"]  # rollouts by URI fetch too
    for mounts in (init["volumeMounts"], c["volumeMounts"]):
        assert {"name": "bundle-cache", "mountPath": cache} in mounts  # writable: the cache
    (volume,) = [v for v in spec["volumes"] if v["name"] == "bundle-cache"]
    assert volume["emptyDir"] == {"sizeLimit": "4Gi"}
    env = env_config(values)
    assert env["ESP_BUNDLE"] == f"{cache}/{remote['sha256']}" == c["command"][c["command"].index("--bundle") + 1]
    assert env["ESP_BUNDLE_CACHE"] == cache and env["ESP_BUNDLE_SHA256"] == remote["sha256"]
    parser = argparse.ArgumentParser()
    fetch_bundle.add_arguments(parser)  # the subcommand the image runs accepts the arguments
    parsed = parser.parse_args(init["command"][2:])
    assert (parsed.uri, parsed.sha256, parsed.cache) == (remote["uri"], remote["sha256"], cache)


def test_remote_bundle_fetched_in_process_is_the_servers_bundle_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    from esp_retrieval.service.config import Settings

    values = scenario_values("remote")
    values["bundle"]["remote"]["fetch"] = "inProcess"
    spec = deployment(values)["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    env = env_config(values)
    assert env["ESP_BUNDLE"] == values["bundle"]["remote"]["uri"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.bundle_uri == values["bundle"]["remote"]["uri"] and settings.bundle is None
    assert settings.bundle_sha256 == values["bundle"]["remote"]["sha256"]


def test_remote_source_needs_a_uri_and_a_digest() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="bundle.remote.uri and bundle.remote.sha256"):
        render({"bundle": {"source": "remote", "remote": {"uri": "https://x/b"}}})
    with helm_python.Chart.load(CHART_DIR) as chart, pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"bundle": {"source": "remote", "remote": {"uri": "/no/scheme", "sha256": "0" * 64}}})


def test_settings_changes_roll_pods_registry_changes_do_not() -> None:
    base = checksum()
    assert set(base) == {"checksum/config"}
    assert checksum({"config": {"maxBatch": 128}}) != base
    assert checksum({"adminToken": {"value": "t0ken"}}) != base
    assert checksum({"registry": {"content": {"version": 1, "operating_points": {}}}}) == base  # hot reload
    rolled = {"registry": {"rollOnChange": True}}
    changed = {"registry": {"rollOnChange": True, "content": {"version": 1, "operating_points": {}}}}
    assert checksum(rolled)["checksum/registry"] != checksum(changed)["checksum/registry"]


def test_settings_reach_the_environment() -> None:
    env = env_config({"config": {"threads": 3, "backend": "faiss", "queueSize": 99}})
    assert env["ESP_THREADS"] == "3" and env["ESP_BACKEND"] == "faiss" and env["ESP_QUEUE_SIZE"] == "99"
    assert env["ESP_HOST"] == "0.0.0.0" and env["ESP_PORT"] == "8000"
    assert "ESP_THREADS" not in env_config()


def test_admin_token_secret() -> None:
    objs = objects({"adminToken": {"value": "t0ken"}})
    secret = objs[("Secret", "esp-retrieval-admin")]
    assert base64.b64decode(secret["data"]["admin-token"]).decode() == "t0ken"
    (env,) = [e for e in container({"adminToken": {"value": "t0ken"}})["env"] if e["name"] == "ESP_ADMIN_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "esp-retrieval-admin", "key": "admin-token"}
    existing = {"adminToken": {"existingSecret": "mine", "value": "ignored"}}
    assert not [k for k in objects(existing) if k[0] == "Secret"]
    (env,) = [e for e in container(existing)["env"] if e["name"] == "ESP_ADMIN_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"]["name"] == "mine"


def test_autoscaling_replaces_replicas() -> None:
    values = scenario_values("cpu")
    objs = objects(values)
    hpa = objs[("HorizontalPodAutoscaler", "esp-retrieval")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "esp-retrieval"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert "replicas" not in objs[("Deployment", "esp-retrieval")]["spec"]
    pdb = objs[("PodDisruptionBudget", "esp-retrieval")]
    assert pdb["spec"] == {
        "minAvailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": {"app.kubernetes.io/name": "esp-retrieval",
                                     "app.kubernetes.io/instance": "esp-retrieval"}},
    }


def _pdb(values: dict[str, Any]) -> dict[str, Any] | None:
    return objects(values).get(("PodDisruptionBudget", "esp-retrieval"))


def test_a_disruption_budget_only_where_it_can_protect_something() -> None:
    """One pod: maxUnavailable 1 lets a drain evict it, minAvailable 1 blocks the drain for good;
    so no budget below two pods (replicas, or the HPA's minimum)."""
    assert _pdb({}) is None  # the default: one replica
    assert _pdb({"podDisruptionBudget": {"minAvailable": 1}}) is None
    assert _pdb({"autoscaling": {"enabled": True, "minReplicas": 1}}) is None
    two = _pdb({"replicaCount": 2})
    assert two is not None and two["spec"]["maxUnavailable"] == 1
    assert two["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert _pdb({"autoscaling": {"enabled": True, "minReplicas": 3}}) is not None
    assert _pdb({"replicaCount": 2, "podDisruptionBudget": {"enabled": False}}) is None


def test_the_hpa_can_scale_on_the_services_queue_depth() -> None:
    from esp_retrieval.service.metrics import METRIC_NAMES

    hpa = objects(scenario_values("monitoring"))[("HorizontalPodAutoscaler", "esp-retrieval")]
    pods = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods == [{"metric": {"name": "esp_queue_depth"}, "target": {"type": "AverageValue", "averageValue": "32"}}]
    assert pods[0]["metric"]["name"] in METRIC_NAMES  # a series the service exports
    cpu_only = objects(scenario_values("cpu"))[("HorizontalPodAutoscaler", "esp-retrieval")]
    assert [m["type"] for m in cpu_only["spec"]["metrics"]] == ["Resource"]  # off by default
    with pytest.raises(helm_python.HelmRenderError, match="needs a target"):
        render({"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": None}})


def test_monitoring_pieces() -> None:
    objs = objects(scenario_values("monitoring"))
    monitor = objs[("ServiceMonitor", "esp-retrieval")]
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = objs[("Service", "esp-retrieval")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()

    dashboards = objs[("ConfigMap", "esp-retrieval-dashboards")]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(dashboards["data"]) == [p.name for p in DASHBOARD_FILES]
    for path in DASHBOARD_FILES:
        assert json.loads(dashboards["data"][path.name]) == json.loads(path.read_text(encoding="utf-8"))

    rule = objs[("PrometheusRule", "esp-retrieval")]
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))  # one source of truth


def test_notes_say_how_to_reach_the_service() -> None:
    notes = render(scenario_values("monitoring"))["esp-retrieval/templates/NOTES.txt"]
    assert "port-forward service/esp-retrieval" in notes
    assert "/v1/search" in notes and "PrometheusRule" in notes
