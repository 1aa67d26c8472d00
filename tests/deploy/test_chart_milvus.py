"""The chart's external-Milvus mode and the example values for the upstream Milvus chart."""

from __future__ import annotations

from pathlib import Path

import helm_python
import pytest
import yaml

from deploy.chart import CHART_DIR, documents, render, scenario_values
from esp_retrieval.service.engine.milvus_backend import MilvusSettings

MILVUS_VALUES = CHART_DIR.parent / "milvus" / "cluster-values.yaml"


def _objects(values: dict) -> dict:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(render(values))}


def test_milvus_values_reach_the_environment_and_the_token_comes_from_the_secret() -> None:
    values = scenario_values("milvus")
    objs = _objects(values)
    env = objs[("ConfigMap", "esp-retrieval-env")]["data"]
    assert env["ESP_BACKEND"] == "milvus"
    assert env["ESP_MILVUS_URI"] == values["milvus"]["uri"]
    assert env["ESP_MILVUS_COLLECTION"] == "esp_demo" and env["ESP_MILVUS_CANDIDATES"] == "400"
    assert "ESP_MILVUS_TOKEN" not in env  # never in a ConfigMap
    (dep,) = [d for (kind, _), d in objs.items() if kind == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    (token,) = [e for e in container["env"] if e["name"] == "ESP_MILVUS_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "esp-milvus-token", "key": "token"}
    # every ESP_MILVUS_* name the chart sets is a setting of the backend
    names = {f"ESP_MILVUS_{k.upper()}" for k in MilvusSettings.model_fields}
    assert {k for k in env if k.startswith("ESP_MILVUS_")} <= names


def test_without_milvus_nothing_changes() -> None:
    env = _objects({})[("ConfigMap", "esp-retrieval-env")]["data"]
    assert env["ESP_BACKEND"] == "auto" and not [k for k in env if k.startswith("ESP_MILVUS_")]


@pytest.mark.parametrize(
    "bad",
    [
        {"milvus": {"enabled": True}},  # no URI
        {"milvus": {"enabled": True, "uri": "my-milvus:19530"}},  # no scheme
        {"milvus": {"enabled": True, "uri": "http://m:19530", "collection": "bad-name"}},
        {"milvus": {"enabled": True, "uri": "http://m:19530", "tokne": "x"}},
    ],
)
def test_schema_rejects_bad_milvus_values(bad: dict) -> None:
    with helm_python.Chart.load(CHART_DIR) as chart, pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(bad)


def test_the_upstream_milvus_example_is_cluster_mode_with_auth() -> None:
    """The upstream chart is not vendored (no network here), so its example is checked for what
    this deployment relies on: cluster mode, token auth, several query nodes, a 2.5 image."""
    values = yaml.safe_load(Path(MILVUS_VALUES).read_text(encoding="utf-8"))
    assert values["cluster"]["enabled"] is True
    user = yaml.safe_load(values["extraConfigFiles"]["user.yaml"])
    assert user["common"]["security"]["authorizationEnabled"] is True
    assert values["queryNode"]["replicas"] >= 2 and values["etcd"]["replicaCount"] == 3
    assert values["image"]["all"]["tag"].startswith("v2.5.")
    ci = yaml.safe_load((CHART_DIR / "ci" / "milvus-values.yaml").read_text(encoding="utf-8"))
    assert ci["milvus"]["uri"].startswith("http://esp-milvus.milvus.svc")  # the release the example installs
