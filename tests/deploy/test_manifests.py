"""k8s-manifests/ is the chart rendered per overlay (deploy/manifests.py): no drift, a kustomize
build of each overlay equals the chart's rendering, every object validates; YAML lints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from yamllint import config as yl_config
from yamllint import linter

from deploy import manifests
from deploy.chart import CHART_DIR, documents, render, scenario_values
from deploy.files import REPO_ROOT, drift
from tests.deploy.support import ALERT_TESTS, KUBE_VERSIONS, validate_object

YAMLLINT = yl_config.YamlLintConfig(
    "{extends: default, rules: {line-length: {max: 160}, document-start: disable,"
    " indentation: {indent-sequences: whatever}, truthy: {check-keys: false}}}"
)


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """``kustomize build`` for what deploy/manifests.py writes: resources lists only."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, "only resources are emulated here"
    assert kustomization["kind"] == "Kustomization"
    docs: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        if path.is_dir():
            docs.extend(kustomize_build(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    return docs


def _by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    keyed = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(keyed) == len(docs), "duplicate objects"
    return keyed


def test_committed_manifests_match_the_chart() -> None:
    problems = drift(manifests.MANIFESTS_DIR, manifests.build(), "**/*.yaml")
    assert not problems, "\n".join([*problems, "run: python -m deploy.manifests"])


@pytest.mark.parametrize("overlay", sorted(manifests.OVERLAYS))
def test_overlay_builds_to_the_chart_rendering(overlay: str) -> None:
    built = _by_key(kustomize_build(manifests.MANIFESTS_DIR / "overlays" / overlay))
    chart = _by_key(documents(render(scenario_values(manifests.OVERLAYS[overlay])), hooks=False))
    assert built == chart


def test_overlays_differ_where_cpu_and_gpu_differ() -> None:
    gpu = _by_key(kustomize_build(manifests.MANIFESTS_DIR / "overlays" / "gpu"))
    (c,) = gpu[("Deployment", "esp-retrieval")]["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    base = {p.name for p in (manifests.MANIFESTS_DIR / "base").iterdir()}
    assert "deployment-esp-retrieval.yaml" not in base and "service-esp-retrieval.yaml" in base


def test_every_manifest_validates_strictly() -> None:
    files = sorted(manifests.MANIFESTS_DIR.rglob("*.yaml"))
    checked = 0
    for path in files:
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            for version in KUBE_VERSIONS:
                validate_object(doc, version)
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize(
    "path",
    [
        CHART_DIR / "Chart.yaml",
        CHART_DIR / "values.yaml",
        *sorted((CHART_DIR / "ci").glob("*.yaml")),
        *sorted((CHART_DIR / "rules").glob("*.yaml")),
        ALERT_TESTS,
        *sorted((REPO_ROOT / "k8s-manifests").rglob("*.yaml")),
    ],
    ids=lambda p: str(p.relative_to(REPO_ROOT)),
)
def test_yaml_lints(path: Path) -> None:
    problems = list(linter.run(path.read_text(encoding="utf-8"), YAMLLINT, str(path)))
    assert not problems, [str(p) for p in problems]
