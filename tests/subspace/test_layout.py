"""Layout validation names the problem; JSON round trip is lossless."""

import numpy as np
import pytest

from esp_retrieval.subspace.layout import LayoutError, Objective, SubspaceLayout


def _layout() -> SubspaceLayout:
    return SubspaceLayout.from_dims(
        {"semantic": 6, "entity": 3, "intent": 2},
        losses={"intent": "cross_entropy"},
        default_weights={"entity": 0.5},
    )


def test_from_dims_computes_offsets_and_defaults() -> None:
    layout = _layout()
    assert layout.names == ("semantic", "entity", "intent")
    assert layout.offsets == (0, 6, 9)
    assert layout.dim == 11
    assert layout["intent"].loss == "cross_entropy"
    np.testing.assert_array_equal(layout.default_weights(), [1.0, 0.5, 1.0])
    assert layout.slice("entity") == slice(6, 9)
    np.testing.assert_array_equal(layout.block_ids(), [0] * 6 + [1] * 3 + [2] * 2)
    assert layout.indicator().sum(axis=0).tolist() == [6, 3, 2]


def test_json_round_trip() -> None:
    layout = _layout()
    again = SubspaceLayout.from_json(layout.to_json())
    assert again == layout
    assert again.to_dict() == layout.to_dict()


@pytest.mark.parametrize(
    ("objectives", "dim", "message"),
    [
        ([("a", 2, 0), ("a", 2, 2)], -1, "duplicate objective name 'a'"),
        ([("a", 2, 0), ("b", 2, 3)], -1, "gap before objective 'b': columns 2..2"),
        ([("a", 3, 0), ("b", 2, 2)], -1, "objective 'b' at offset 2 overlaps the previous block, which ends at 3"),
        ([("a", 2, 1)], -1, "gap before objective 'a'"),
        ([("a", 2, 0), ("b", 2, 2)], 5, "layout dim is 5 but the objectives' dims add up to 4"),
        ([], -1, "layout has no objectives"),
    ],
)
def test_invalid_layouts_are_named(objectives: list, dim: int, message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        SubspaceLayout(tuple(Objective(n, d, o) for n, d, o in objectives), dim=dim)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "a", "dim": 0, "offset": 0}, "dim must be positive, got 0"),
        ({"name": "a", "dim": -3, "offset": 0}, "dim must be positive, got -3"),
        ({"name": "a", "dim": 2.0, "offset": 0}, "dim must be an integer"),
        ({"name": "a", "dim": True, "offset": 0}, "dim must be an integer"),
        ({"name": "Bad Name", "dim": 2, "offset": 0}, "objective name 'Bad Name' is invalid"),
        ({"name": "a", "dim": 2, "offset": 0, "default_weight": -1.0}, "default_weight must be a finite number"),
        ({"name": "a", "dim": 2, "offset": 0, "default_weight": float("nan")}, "default_weight"),
        ({"name": "a", "dim": 2, "offset": 0, "loss": ""}, "loss must be a non-empty string"),
    ],
)
def test_invalid_objectives_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        Objective(**kwargs)


def test_all_zero_default_weights_rejected() -> None:
    with pytest.raises(LayoutError, match="all default weights are zero"):
        SubspaceLayout.from_dims({"a": 2, "b": 2}, default_weights={"a": 0.0, "b": 0.0})


def test_from_dict_rejects_unknown_and_missing_fields() -> None:
    with pytest.raises(LayoutError, match=r"unknown field\(s\) \['wieght'\]"):
        SubspaceLayout.from_dict({"objectives": [{"name": "a", "dim": 2, "offset": 0, "wieght": 1}]})
    with pytest.raises(LayoutError, match=r"lacks field\(s\) \['offset'\]"):
        SubspaceLayout.from_dict({"objectives": [{"name": "a", "dim": 2}]})
    with pytest.raises(LayoutError, match="must be a list"):
        SubspaceLayout.from_dict({"objectives": "a"})
    with pytest.raises(LayoutError, match="not valid JSON"):
        SubspaceLayout.from_json("{")


def test_index_lists_valid_names() -> None:
    with pytest.raises(KeyError, match=r"unknown subspace 'x'; valid: \['semantic', 'entity', 'intent'\]"):
        _layout().index("x")
