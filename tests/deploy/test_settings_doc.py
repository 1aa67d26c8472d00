"""The settings table (docs/settings.md) and the Helm chart follow the settings classes.

The table is generated from ``esp_retrieval.service.config.Settings`` and ``MilvusSettings``
(``python -m deploy.settings_doc``): it fails here when it drifts from them. Every setting has
a place in the chart (``deploy.settings_doc.HELM``), and the chart renders each one into the
pod's environment with the value given (rendered here, value by value). Every ``ESP_*`` name
the docs, the chart, the manifests, the Dockerfiles and the server's messages mention is a setting.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import pytest

from deploy import settings_doc
from deploy.chart import CHART_DIR, documents, render
from deploy.files import REPO_ROOT
from deploy.settings_doc import HELM, Fixed, NotServed, Value


def _envs() -> list[str]:
    return [r.env for r in settings_doc.rows()]


def test_the_committed_table_is_the_generated_one() -> None:
    assert settings_doc.main(["--check"]) == 0, "run `python -m deploy.settings_doc`"


def test_the_table_has_one_row_per_setting_each_described_and_placed_in_the_chart() -> None:
    text = (REPO_ROOT / settings_doc.DOC).read_text(encoding="utf-8")
    envs = _envs()
    assert len(envs) == len(set(envs)) > 60
    assert {"ESP_BUNDLE", "ESP_ANN_MAX_TOUCHED", "ESP_MAX_K", "ESP_MILVUS_URI", "ESP_EXPOSURE_SALT"} <= set(envs)
    for env in envs:
        assert text.count(f"| `{env}` |") == 1, env
    for row in settings_doc.rows():
        assert row.description, f"{row.env}: no description in its Field"
    assert set(HELM) == set(envs), "a setting without a HELM entry, or an entry for no setting"


def _set(values: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        values = values.setdefault(key, {})
    values[leaf] = value


def _environment(values: dict[str, Any]) -> dict[str, Any]:
    """The server container's environment: its ConfigMap's data, then its own env entries."""
    docs = documents(render(values))
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-env"))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    server = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c.get("envFrom"))
    env: dict[str, Any] = dict(config["data"])
    env.update({e["name"]: e.get("value", e.get("valueFrom")) for e in server.get("env", [])})
    return env


def _groups() -> dict[tuple[tuple[str, Any], ...], list[str]]:
    groups: dict[tuple[tuple[str, Any], ...], list[str]] = defaultdict(list)
    for env, place in HELM.items():
        if isinstance(place, Value):
            groups[tuple(sorted(place.needs.items()))].append(env)
    return groups


@pytest.mark.parametrize("needs", list(_groups()), ids=lambda n: ",".join(k for k, _ in n) or "defaults")
def test_every_setting_the_chart_takes_reaches_the_environment_with_its_value(
    needs: tuple[tuple[str, Any], ...],
) -> None:
    envs = _groups()[needs]
    values: dict[str, Any] = {}
    for key, value in needs:
        _set(values, key, value)
    for env in envs:
        place = HELM[env]
        assert isinstance(place, Value)
        _set(values, place.path, place.example)
    got = _environment(values)
    for env in envs:
        place = HELM[env]
        assert isinstance(place, Value)
        name = place.env or env
        assert name in got, f"{env}: {place.path} sets nothing"
        if place.secret:
            assert got[name]["secretKeyRef"]["name"] == place.example, env
        else:
            want = place.expect if place.expect is not None else settings_doc.rendered(place.example)
            assert got[name] == want, f"{env} from {place.path}"


def test_fixed_settings_are_what_the_chart_sets_and_load_only_ones_are_not_set() -> None:
    got = _environment({})
    for env, place in HELM.items():
        if isinstance(place, Fixed):
            assert got[env] == place.value, env
        if isinstance(place, NotServed):
            assert env not in got, env
    milvus = _environment({"milvus": {"enabled": True, "uri": "http://milvus.example:19530"}})
    assert not [e for e, p in HELM.items() if isinstance(p, NotServed) and e in milvus]


def _same(rendered: str, default: str) -> bool:
    want = default.strip("`")
    try:
        return float(rendered) == float(want)
    except ValueError:
        return rendered == want


def test_the_chart_defaults_are_the_servers_defaults() -> None:
    """A setting the chart always sets holds the server's own default unless values say otherwise."""
    got = _environment({})
    checked = 0
    for row in settings_doc.rows():
        place = HELM[row.env]
        if not isinstance(place, Value) or place.needs or place.secret or place.env or row.env not in got:
            continue
        if row.env in {"ESP_BUNDLE", "ESP_REGISTRY"}:  # paths inside the pod where the server has none
            continue
        assert _same(got[row.env], row.default), f"{row.env}: chart {got[row.env]!r}, server {row.default}"
        checked += 1
    assert checked > 40


_MENTIONED = re.compile(r"\bESP_[A-Z0-9_]*[A-Z0-9]\b")
#: names of other settings families (the training config's overrides) and of prefixes
_NOT_SETTINGS = re.compile(r"^ESP_(TRAIN_.*|MILVUS|EXPOSURE)$")
#: variables of other programs than the server
_OTHERS = {
    "ESP_UI_BUNDLE": "the /ui screenshot test (README)",
    "ESP_UI_SCREENSHOT": "the /ui screenshot test (README)",
    "ESP_URL": "the `helm test` pod's target",
}


def _mentions() -> dict[str, set[str]]:
    files = [
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").glob("*.md"),
        *(REPO_ROOT / "esp_retrieval" / "service").rglob("*.py"),
        *(REPO_ROOT / "esp_retrieval" / "cli").glob("*.py"),
        *(p for p in CHART_DIR.rglob("*") if p.is_file() and p.suffix in {".yaml", ".md", ".tpl", ".txt", ".json"}),
        *(REPO_ROOT / "k8s-manifests").rglob("*.yaml"),
        *(REPO_ROOT / "docker").glob("*Dockerfile*"),
    ]
    found: dict[str, set[str]] = defaultdict(set)
    for path in files:
        for name in _MENTIONED.findall(path.read_text(encoding="utf-8")):
            found[name].add(str(path.relative_to(REPO_ROOT)))
    return found


def test_every_esp_name_the_docs_chart_and_server_mention_is_a_setting() -> None:
    known = set(_envs())
    unknown = {
        name: sorted(where) for name, where in _mentions().items()
        if name not in known and name not in _OTHERS and not _NOT_SETTINGS.match(name)
    }
    assert not unknown
