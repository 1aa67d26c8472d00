"""Helpers shared by the deployment tests: PromQL in dashboards and alerts, exposition parsing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from deploy.chart import CHART_DIR

RULES_FILE = CHART_DIR / "rules" / "esp-alerts.yaml"
DASHBOARD_FILES = sorted((CHART_DIR / "dashboards").glob("*.json"))
ALERT_TESTS = Path(__file__).with_name("esp-alerts.test.yaml")

_METRIC = re.compile(r"\b(esp_[a-z0-9_]+)\b")
#: Values the tests give Grafana's template variables ("All" is ".*" in the dashboards).
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$namespace": ".*",
    "$job": ".*",
    "$experiment": ".*",
}


def tool(name: str) -> str | None:
    """Path of a command-line tool (promtool, prometheus), or None when it is not installed."""
    return shutil.which(name)


def substitute(expr: str, variables: dict[str, str] | None = None) -> str:
    """Replace Grafana template variables so that Prometheus can parse and run ``expr``."""
    for name, value in (variables or GRAFANA_VARIABLES).items():
        expr = expr.replace(name, value)
    if "$" in expr:
        raise AssertionError(f"unknown template variable left in {expr!r}")
    return expr


def dashboard_targets() -> list[tuple[str, str, str]]:
    """``(dashboard title, panel title, expr)`` for every query of every committed dashboard."""
    out = []
    for path in DASHBOARD_FILES:
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            for target in panel.get("targets") or []:
                out.append((board["title"], panel["title"], target["expr"]))
    return out


def dashboard_panels() -> list[dict[str, Any]]:
    """Every non-row panel of every committed dashboard."""
    return [
        panel
        for path in DASHBOARD_FILES
        for panel in json.loads(path.read_text(encoding="utf-8"))["panels"]
        if panel["type"] != "row"
    ]


def alert_rules() -> list[dict[str, Any]]:
    """Every rule of the alert rules file."""
    doc = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def series_names(expr: str) -> set[str]:
    """The ``esp_*`` series an expression reads (``_bucket`` etc. included, as written)."""
    return set(_METRIC.findall(expr))


def exposed_series(exposition: str) -> dict[str, str]:
    """Series name -> metric type, from the ``# TYPE`` lines of a Prometheus text exposition.

    A histogram ``h`` exposes ``h_bucket``, ``h_sum`` and ``h_count``. Families are declared
    even before their first labelled sample, so this is what the service *exports*.
    """
    out: dict[str, str] = {}
    for line in exposition.splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, name, kind = line.split(maxsplit=3)
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[name + suffix] = kind
        elif kind == "counter" and not name.endswith("_total"):
            out[name + "_total"] = kind
        else:
            out[name] = kind
    return out


def recording_rules_file(exprs: list[str], path: Path) -> Path:
    """Write ``exprs`` as recording rules: ``promtool check rules`` then parses every one."""
    rules = [{"record": f"esp:dashboard_query:{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    return path


#: Kubernetes versions the chart's objects must validate against (Chart.yaml kubeVersion >=1.27).
KUBE_VERSIONS = ("1.27.0", "1.37.0")


def validate_object(doc: dict[str, Any], version: str) -> None:
    """Validate one object strictly: built-in kinds with kubernetes-validate, CRDs with ours."""
    import jsonschema
    import kubernetes_validate

    from tests.deploy.crd_schemas import SCHEMAS

    schema = SCHEMAS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if schema is not None:
        jsonschema.Draft7Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)
