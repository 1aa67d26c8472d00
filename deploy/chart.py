"""Render the Helm chart offline (helm-python-sdk: Helm's Go engine, no helm binary) to documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

from deploy.files import REPO_ROOT

CHART_DIR = REPO_ROOT / "helm" / "esp-retrieval"
#: Release name used for k8s-manifests and tests: resource names become plain "esp-retrieval".
RELEASE = "esp-retrieval"


def scenarios() -> list[str]:
    """Names of the chart's CI scenarios (``ci/<name>-values.yaml``), sorted."""
    return sorted(p.name.removesuffix("-values.yaml") for p in (CHART_DIR / "ci").glob("*-values.yaml"))


def scenario_values(name: str) -> dict[str, Any]:
    """The values of scenario ``name``; ``default`` means the chart's defaults (no overrides)."""
    if name == "default":
        return {}
    path = CHART_DIR / "ci" / f"{name}-values.yaml"
    if not path.is_file():
        raise ValueError(f"scenario {name!r}: no {path.name}; known: {['default', *scenarios()]}")
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path.name}: must hold a mapping of values")
    return values


def render(
    values: dict[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str | None = None,
    chart_dir: Path = CHART_DIR,
) -> dict[str, str]:
    """Template path -> rendered text, as ``helm template`` would produce (values schema checked)."""
    with helm_python.Chart.load(chart_dir) as chart:
        return chart.render(values or {}, name=release, namespace=namespace, is_install=True)


def is_hook(doc: dict[str, Any]) -> bool:
    """A Helm hook (``helm test``'s pod): run by Helm on demand, not part of the release."""
    return "helm.sh/hook" in ((doc.get("metadata") or {}).get("annotations") or {})


def documents(rendered: dict[str, str], *, hooks: bool = True) -> list[dict[str, Any]]:
    """Every Kubernetes object in a rendering, in template-path order (NOTES.txt and empties
    dropped; Helm hooks too when ``hooks`` is false)."""
    docs: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if doc and (hooks or not is_hook(doc)):
                docs.append(doc)
    return docs
