"""Request weights: dicts by name, lists in layout order, and every rejection with its message."""

import numpy as np
import pytest

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.weights import WeightError, resolve_block_weights, resolve_weights, weights_dict

LAYOUT = SubspaceLayout.from_dims({"semantic": 4, "entity": 2, "intent": 2}, default_weights={"entity": 0.5})


def test_partial_dict_completed_from_layout_defaults() -> None:
    np.testing.assert_array_equal(resolve_block_weights({"intent": 3}, LAYOUT), [1.0, 0.5, 3.0])


def test_partial_dict_completed_from_given_default() -> None:
    default = {"semantic": 0.2, "entity": 0.8, "intent": 0.0}
    np.testing.assert_array_equal(resolve_block_weights({"intent": 1}, LAYOUT, default), [0.2, 0.8, 1.0])


def test_none_gives_default_and_list_in_layout_order() -> None:
    np.testing.assert_array_equal(resolve_block_weights(None, LAYOUT), [1.0, 0.5, 1.0])
    np.testing.assert_array_equal(resolve_block_weights([0, 2, 1], LAYOUT), [0.0, 2.0, 1.0])


def test_dense_per_dimension_vector() -> None:
    dense = resolve_weights({"semantic": 2, "entity": 0, "intent": 1}, LAYOUT)
    np.testing.assert_array_equal(dense, [2, 2, 2, 2, 0, 0, 1, 1])
    assert weights_dict(np.array([2.0, 0.0, 1.0]), LAYOUT) == {"semantic": 2.0, "entity": 0.0, "intent": 1.0}


@pytest.mark.parametrize(
    ("weights", "field", "message"),
    [
        ({"colour": 1.0}, "weights.colour", r"unknown subspace 'colour'; valid names: \['semantic', 'entity', 'intent'\]"),
        ({"entity": -0.1}, "weights.entity", r"must be >= 0, got -0\.1"),
        ({"entity": float("nan")}, "weights.entity", "must be finite"),
        ({"entity": float("inf")}, "weights.entity", "must be finite"),
        ({"entity": True}, "weights.entity", "must be a number >= 0, got bool True"),
        ({"entity": "0.5"}, "weights.entity", "must be a number >= 0, got str '0.5'"),
        ({"entity": None}, "weights.entity", "must be a number >= 0, got NoneType"),
        ([1.0, 2.0], "weights", r"needs exactly 3 values, in layout order \['semantic', 'entity', 'intent'\]; got 2"),
        ([1.0, False, 1.0], "weights[1]", "got bool False"),
        ([0, 0, 0], "weights", "all zero"),
        ({"semantic": 0, "entity": 0, "intent": 0}, "weights", "all zero"),
        ("semantic", "weights", "must be an object by subspace name"),
    ],
)
def test_rejections_name_field_and_allowed(weights: object, field: str, message: str) -> None:
    with pytest.raises(WeightError, match=message) as info:
        resolve_block_weights(weights, LAYOUT)  # type: ignore[arg-type]
    assert info.value.field == field


def test_field_prefix_is_used() -> None:
    with pytest.raises(WeightError) as info:
        resolve_block_weights({"x": 1}, LAYOUT, field="queries[3].weights")
    assert info.value.field == "queries[3].weights.x"


def test_invalid_default_is_rejected() -> None:
    with pytest.raises(WeightError, match="unknown subspace 'nope'"):
        resolve_block_weights({"entity": 1}, LAYOUT, default={"nope": 1})
