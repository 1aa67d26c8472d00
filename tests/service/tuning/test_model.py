"""Registry files: validation names the field; resolve takes one weight source per query."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.service.tuning import Registry, RegistryError
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims(
    {"semantic": 16, "entity": 8, "intent": 8}, default_weights={"semantic": 1.0, "entity": 0.5, "intent": 0.25}
)
EXAMPLE = Path(__file__).resolve().parents[3] / "configs" / "registry.example.yaml"

DOC: dict[str, Any] = {
    "version": 1,
    "operating_points": {
        "balanced": {"weights": {"semantic": 1.0, "entity": 1.0, "intent": 1.0}, "description": "equal"},
        "entity_heavy": {"weights": {"semantic": 0.2, "entity": 0.8}, "metrics": {"ndcg@10": 0.9}},
    },
    "experiments": {
        "ent": {
            "salt": "ent-v1",
            "default_arm": "control",
            "arms": [
                {"name": "control", "share": 0.5, "operating_point": "balanced"},
                {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy"},
            ],
        }
    },
}


def _doc(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(DOC)
    for path, value in changes.items():
        node = doc
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        last = keys[-1]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return doc


_DELETE = object()


def test_example_registry_is_valid_for_the_demo_layout() -> None:
    demo = SubspaceLayout.from_dims({"semantic": 256, "entity": 96, "intent": 32})
    reg = Registry.load(EXAMPLE, demo)
    assert reg.default_operating_point in reg.operating_points
    assert reg.experiments, "the example shows one experiment"
    for exp in reg.experiments.values():
        assert all(a.operating_point in reg.operating_points for a in exp.arms)


def test_parse_completes_weights_and_keeps_order() -> None:
    reg = Registry.parse(DOC, LAYOUT)
    assert list(reg.operating_points) == ["balanced", "entity_heavy"]
    # missing names take the layout's default weight; every layout name is present, in layout order
    assert reg.operating_points["entity_heavy"].weights == {"semantic": 0.2, "entity": 0.8, "intent": 0.25}
    assert reg.operating_points["entity_heavy"].metrics == {"ndcg@10": 0.9}
    assert [a.name for a in reg.experiments["ent"].arms] == ["control", "treatment"]
    assert reg.known_labels() == [("ent", "control"), ("ent", "treatment")]


@pytest.mark.parametrize(
    ("changes", "field", "needle"),
    [
        ({"operating_points__balanced__weights__topic": 1.0}, "operating_points.balanced.weights.topic",
         "unknown subspace 'topic'; valid names: ['semantic', 'entity', 'intent']"),
        ({"operating_points__balanced__weights__entity": -0.1}, "operating_points.balanced.weights.entity",
         ">= 0"),
        ({"operating_points__balanced__weights__entity": float("nan")},
         "operating_points.balanced.weights.entity", "finite"),
        ({"operating_points__balanced__weights__entity": True}, "operating_points.balanced.weights.entity",
         "number, got boolean"),
        ({"operating_points__balanced__weights__entity": "1e-3"}, "operating_points.balanced.weights.entity",
         "1.0e-3"),
        ({"operating_points__balanced__weights": {"semantic": 0, "entity": 0, "intent": 0}},
         "operating_points.balanced.weights", "all zero"),
        ({"operating_points__balanced__weight": {"semantic": 1.0}}, "operating_points.balanced",
         "unknown key(s) ['weight']"),
        ({"operating_points__balanced__weights": _DELETE}, "operating_points.balanced", "['weights']"),
        ({"operating_points__balanced__weights": [1.0, 1.0, 1.0]}, "operating_points.balanced.weights",
         "mapping"),
        ({"operating_points__bad name": {"weights": {}}}, "operating_points.bad name", "invalid"),
        ({"operating_points__trailing\n": {"weights": {}}}, "operating_points.trailing\n", "invalid"),
        ({"experiments__ent__arms__0__name": "x" * 65}, "experiments.ent.arms[0].name", "1-64"),
        ({"experiments__ent__arms__1__share": 0.4}, "experiments.ent.arms", "sum to 1"),
        ({"experiments__ent__arms__1__share": 0.0}, "experiments.ent.arms[1].share", "> 0"),
        ({"experiments__ent__arms__0__share": -0.5, "experiments__ent__arms__1__share": 1.5},
         "experiments.ent.arms[0].share", "> 0"),
        ({"experiments__ent__arms__1__operating_point": "entity_max"},
         "experiments.ent.arms[1].operating_point", "unknown operating point 'entity_max'"),
        ({"experiments__ent__arms__1__name": "control"}, "experiments.ent.arms[1].name", "duplicate arm"),
        ({"experiments__ent__default_arm": "nope"}, "experiments.ent.default_arm", "not one of the arms"),
        ({"experiments__ent__salt": 42}, "experiments.ent.salt", "string"),
        ({"experiments__ent__salt": ""}, "experiments.ent.salt", "non-empty"),
        ({"experiments__ent__salt": _DELETE}, "experiments.ent", "['salt']"),
        ({"experiments__ent__arms": []}, "experiments.ent.arms", "non-empty list"),
        ({"experiments__ent__trafic": 0.5}, "experiments.ent", "unknown key(s) ['trafic']"),
        ({"experiments__ent__traffic": 1.5}, "experiments.ent.traffic", "[0, 1]"),
        ({"experiments__ent__traffic": 0.5, "experiments__ent__default_arm": _DELETE},
         "experiments.ent.default_arm", "required when traffic < 1"),
        ({"experiments__ent__enabled": "yes"}, "experiments.ent.enabled", "true or false"),
        ({"experiments__ent__arms__0__weight": 1}, "experiments.ent.arms[0]", "unknown key(s) ['weight']"),
        ({"default_operating_point": "nope"}, "default_operating_point", "unknown operating point 'nope'"),
        ({"operating_point": {}}, None, "unknown key(s) ['operating_point']"),
        ({"version": 2}, "version", "unsupported registry version 2"),
        ({"operating_points__balanced__metrics": {"ndcg": float("inf")}},
         "operating_points.balanced.metrics.ndcg", "finite"),
    ],
)
def test_invalid_registry_names_the_field(changes: dict[str, Any], field: str | None, needle: str) -> None:
    with pytest.raises(RegistryError) as err:
        Registry.parse(_doc(**changes), LAYOUT, source="reg.yaml")
    assert err.value.field == field
    assert needle in err.value.message
    assert err.value.message.startswith("reg.yaml: ")


def test_shares_summing_to_one_within_tolerance_are_accepted() -> None:
    doc = _doc(experiments__ent__default_arm="a0", experiments__ent__arms=[
        {"name": f"a{i}", "share": 0.1, "operating_point": "balanced"} for i in range(10)
    ])
    assert sum(a.share for a in Registry.parse(doc, LAYOUT).experiments["ent"].arms) != 1.0  # float sum
    with pytest.raises(RegistryError, match="sum to 1"):
        Registry.parse(_doc(experiments__ent__arms__1__share=0.5 + 1e-8), LAYOUT)


def test_malformed_files_name_the_file_and_the_problem(tmp_path: Path) -> None:
    cases: dict[str, str | bytes] = {
        "broken.yaml": "operating_points: {balanced: {weights: {semantic: 1.0}\n",
        "dup.yaml": "operating_points:\n  a: {weights: {semantic: 1.0}}\n  a: {weights: {entity: 1.0}}\n",
        "broken.json": '{"operating_points": ',
        "dup.json": '{"experiments": {}, "experiments": {}}',
        "empty.yaml": "\n",
        "list.yaml": "- a\n- b\n",
        "binary.yaml": b"\xff\xfe\x00",
    }
    expected = {
        "broken.yaml": "not valid YAML",
        "dup.yaml": "duplicate key 'a' (line 3",
        "broken.json": "not valid JSON",
        "dup.json": "duplicate key 'experiments'",
        "empty.yaml": "empty",
        "list.yaml": "must be a mapping, got list",
        "binary.yaml": "not UTF-8",
    }
    for name, content in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        with pytest.raises(RegistryError) as err:
            Registry.load(path, LAYOUT)
        assert str(path) in err.value.message, name
        assert expected[name] in err.value.message, (name, err.value.message)
    with pytest.raises(RegistryError, match="cannot read"):
        Registry.load(tmp_path / "absent.yaml", LAYOUT)


def test_yaml_aliases_are_refused_before_they_expand(tmp_path: Path) -> None:
    shared = "operating_points:\n  a: {weights: &w {semantic: 1.0}}\n  b: {weights: *w}\n"
    merged = "operating_points:\n  a: &p {weights: {semantic: 1.0}}\n  b: {<<: *p, description: x}\n"
    laughs = "x0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )  # 9^9 values once expanded
    for name, text, where in [("shared.yaml", shared, "*w is not allowed: write the value out (line 3"),
                              ("merged.yaml", merged, "*p is not allowed"), ("laughs.yaml", laughs, "*x0")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(RegistryError, match=re.escape(where)):
            Registry.load(tmp_path / name, LAYOUT)


def test_json_and_yaml_load_the_same_registry(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "r.json").write_text(json.dumps(DOC))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(DOC, sort_keys=False))
    a, b = Registry.load(tmp_path / "r.json", LAYOUT), Registry.load(tmp_path / "r.yaml", LAYOUT)
    assert dict(a.operating_points) == dict(b.operating_points)
    assert dict(a.experiments) == dict(b.experiments)


# --- bundle operating points -------------------------------------------------------------------

BUNDLE_POINTS = {
    "balanced": {"weights": {"semantic": 1.0, "entity": 1.0, "intent": 1.0}, "description": "from training",
                 "metrics": {"ndcg@10": 0.71}},
    "semantic_first": {"weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0},
                       "description": "best NDCG", "metrics": {"ndcg@10": 0.74}, "extra": "ignored"},
}


def test_registry_points_override_bundle_points_by_name() -> None:
    reg = Registry.parse(DOC, LAYOUT, BUNDLE_POINTS)
    assert set(reg.operating_points) == {"balanced", "entity_heavy", "semantic_first"}
    assert reg.operating_points["semantic_first"].source == "bundle"
    assert reg.operating_points["semantic_first"].metrics == {"ndcg@10": 0.74}
    balanced = reg.operating_points["balanced"]
    assert balanced.source == "registry"
    assert balanced.description == "equal"
    # same weights as the bundle's point: its offline metrics still describe it
    assert balanced.metrics == {"ndcg@10": 0.71}
    changed = Registry.parse(_doc(operating_points__balanced__weights={"entity": 0.1}), LAYOUT, BUNDLE_POINTS)
    assert changed.operating_points["balanced"].metrics == {}  # measured at other weights: dropped
    assert changed.operating_points["balanced"].weights["entity"] == 0.1


def test_arms_may_use_bundle_points_and_no_file_means_bundle_points_only() -> None:
    doc = _doc(experiments__ent__arms__1__operating_point="semantic_first")
    assert Registry.parse(doc, LAYOUT, BUNDLE_POINTS).experiments["ent"].arms[1].operating_point == "semantic_first"
    with pytest.raises(RegistryError, match="unknown operating point 'semantic_first'"):
        Registry.parse(doc, LAYOUT)
    only = Registry.parse(None, LAYOUT, BUNDLE_POINTS)
    assert set(only.operating_points) == {"balanced", "semantic_first"}
    assert not only.experiments
    with pytest.raises(RegistryError) as err:
        Registry.parse(None, LAYOUT, {"x": {"weights": {"topic": 1.0}}})
    assert err.value.message.startswith("bundle manifest: operating_points.x.weights.topic")


# --- resolve -------------------------------------------------------------------------------------


@pytest.fixture
def reg() -> Registry:
    return Registry.parse(DOC, LAYOUT)


def test_resolve_defaults_to_layout_defaults_or_the_default_point(reg: Registry) -> None:
    r = reg.resolve(LAYOUT)
    np.testing.assert_array_equal(r.block_weights, [1.0, 0.5, 0.25])
    assert r.block_weights.dtype == np.float64
    assert (r.operating_point, r.experiment, r.arm) == (None, None, None)
    with_default = Registry.parse(_doc(default_operating_point="entity_heavy"), LAYOUT)
    r = with_default.resolve(LAYOUT)
    assert r.operating_point == "entity_heavy"
    assert r.weights_used == {"semantic": 0.2, "entity": 0.8, "intent": 0.25}
    # explicit partial weights are completed from the default operating point
    r = with_default.resolve(LAYOUT, weights={"intent": 2.0})
    assert r.weights_used == {"semantic": 0.2, "entity": 0.8, "intent": 2.0}
    assert r.operating_point is None


def test_resolve_weights_operating_point_and_experiment(reg: Registry) -> None:
    r = reg.resolve(LAYOUT, weights={"entity": 3.0})
    assert r.weights_used == {"semantic": 1.0, "entity": 3.0, "intent": 0.25}
    r = reg.resolve(LAYOUT, weights=[0.0, 1.0, 2.0])
    np.testing.assert_array_equal(r.block_weights, [0.0, 1.0, 2.0])
    r = reg.resolve(LAYOUT, operating_point="entity_heavy")
    assert (r.operating_point, r.weights_used["entity"]) == ("entity_heavy", 0.8)
    arms = {reg.resolve(LAYOUT, experiment="ent", unit_id=f"u{i}").arm for i in range(50)}
    assert arms == {"control", "treatment"}
    r = reg.resolve(LAYOUT, experiment="ent", unit_id="u1")
    arm = reg.experiments["ent"].arm(r.arm or "")
    assert r.experiment == "ent"
    assert r.operating_point == arm.operating_point
    assert r.weights_used == reg.operating_points[arm.operating_point].weights
    assert r == reg.resolve(LAYOUT, experiment="ent", unit_id="u1")._replace(block_weights=r.block_weights)
    assert not r.excluded


@pytest.mark.parametrize(
    ("kwargs", "field", "needle"),
    [
        ({"weights": {"entity": 1.0}, "operating_point": "balanced"}, "queries[0].operating_point",
         "one source of weights"),
        ({"operating_point": "balanced", "experiment": "ent", "unit_id": "u"}, "queries[0].experiment",
         "one source of weights"),
        ({"weights": {"entity": 1.0}, "experiment": "ent", "unit_id": "u"}, "queries[0].experiment",
         "one source of weights"),
        ({"operating_point": "nope"}, "queries[0].operating_point", "defined: ['balanced', 'entity_heavy']"),
        ({"experiment": "nope", "unit_id": "u"}, "queries[0].experiment", "defined: ['ent']"),
        ({"experiment": "ent"}, "queries[0].unit_id", "needs a unit_id"),
        ({"experiment": "ent", "unit_id": ""}, "queries[0].unit_id", "non-empty"),
        ({"unit_id": "u"}, "queries[0].unit_id", "only used together with experiment"),
        ({"weights": {"topic": 1.0}}, "queries[0].weights.topic", "valid names"),
        ({"weights": {"entity": -1.0}}, "queries[0].weights.entity", ">= 0"),
        ({"weights": {"semantic": True}}, "queries[0].weights.semantic", "number"),
        ({"weights": [0.0, 0.0, 0.0]}, "queries[0].weights", "all zero"),
        ({"weights": [1.0]}, "queries[0].weights", "exactly 3"),
    ],
)
def test_resolve_rejects_with_a_validation_error(reg: Registry, kwargs: dict[str, Any], field: str,
                                                 needle: str) -> None:
    with pytest.raises(RegistryError) as err:
        reg.resolve(LAYOUT, field="queries[0]", **kwargs)
    assert err.value.field == field
    assert needle in err.value.message


def test_resolve_field_defaults_to_the_bare_name(reg: Registry) -> None:
    with pytest.raises(RegistryError) as err:
        reg.resolve(LAYOUT, weights={"x": 1.0})
    assert err.value.field == "weights.x"
    with pytest.raises(RegistryError) as err:
        reg.resolve(LAYOUT, experiment="ent")
    assert err.value.field == "unit_id"


def test_resolve_against_a_foreign_layout_is_not_ready(reg: Registry) -> None:
    other = SubspaceLayout.from_dims({"semantic": 16, "topic": 8})
    with pytest.raises(NotReadyError):
        reg.resolve(other, operating_point="balanced")
    same_names = SubspaceLayout.from_dims({"semantic": 32, "entity": 8, "intent": 8})
    assert reg.resolve(same_names, operating_point="entity_heavy").weights_used["entity"] == 0.8


def test_empty_registry_serves_explicit_weights_and_layout_defaults() -> None:
    empty = Registry.empty()
    assert not empty.operating_points and not empty.experiments
    np.testing.assert_array_equal(empty.resolve(LAYOUT).block_weights, LAYOUT.default_weights())
    assert empty.resolve(LAYOUT, weights={"intent": 4.0}).weights_used["intent"] == 4.0
    with pytest.raises(RegistryError, match=r"defined: \[\]"):
        empty.resolve(LAYOUT, operating_point="balanced")


def test_public_experiment_view_hides_the_salt(reg: Registry) -> None:
    view = reg.experiments["ent"].to_dict()
    assert "salt" not in view
    assert "ent-v1" not in json.dumps(view)
    other = Registry.parse(_doc(experiments__ent__salt="ent-v2"), LAYOUT).experiments["ent"].to_dict()
    assert view["salt_fingerprint"] != other["salt_fingerprint"]
    assert view["arms"] == [
        {"name": "control", "share": 0.5, "operating_point": "balanced"},
        {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy"},
    ]


def test_check_command_validates_like_the_service(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from esp_retrieval.service.tuning.__main__ import main

    demo = "semantic=256,entity=96,intent=32"
    assert main(["check", str(EXAMPLE), "--layout", demo]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["default_operating_point"] == "default"
    assert "entity-weight-2026-q4-v1" not in json.dumps(out)  # the salt stays private
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("entity: 0.8", "entity: -0.8"))
    assert main(["check", str(bad), "--layout", demo]) == 1
    assert "operating_points.entity_boost.weights.entity: must be >= 0" in capsys.readouterr().err
    assert main(["assign", str(EXAMPLE), "entity-weight-2026-q4", "u1", "u2", "--layout", demo]) == 0
    lines = capsys.readouterr().out.splitlines()
    reg = Registry.load(EXAMPLE, SubspaceLayout.from_dims({"semantic": 256, "entity": 96, "intent": 32}))
    assert lines == [f"{u}\t{reg.assign('entity-weight-2026-q4', u).name}\t"
                     f"{reg.assign('entity-weight-2026-q4', u).operating_point}" for u in ("u1", "u2")]
