"""The layout's name/dim/offset tuples are built once, and stay consistent with the objectives."""

import dataclasses

import numpy as np

from esp_retrieval.subspace.layout import Objective, SubspaceLayout


def _layout() -> SubspaceLayout:
    return SubspaceLayout.from_dims(
        {"semantic": 6, "entity": 3, "intent": 2}, default_weights={"entity": 0.5}
    )


def test_tuples_are_built_once_and_match_the_objectives() -> None:
    layout = _layout()
    assert layout.names is layout.names
    assert layout.dims is layout.dims
    assert layout.offsets is layout.offsets
    assert layout.names == tuple(o.name for o in layout.objectives)
    assert layout.dims == tuple(o.dim for o in layout.objectives) == (6, 3, 2)
    assert layout.offsets == tuple(o.offset for o in layout.objectives) == (0, 6, 9)


def test_cached_fields_leave_equality_hash_and_repr_alone() -> None:
    a, b = _layout(), SubspaceLayout.from_json(_layout().to_json())
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    assert "_names" not in repr(a)
    assert a != SubspaceLayout.from_dims({"semantic": 6, "entity": 3, "other": 2})


def test_default_weights_is_a_fresh_array_each_call() -> None:
    layout = _layout()
    w = layout.default_weights()
    w[0] = 99.0  # a caller may scale its copy
    np.testing.assert_array_equal(layout.default_weights(), [1.0, 0.5, 1.0])
    assert layout.default_weights().dtype == np.float64


def test_replace_rebuilds_the_tuples() -> None:
    layout = _layout()
    other = dataclasses.replace(layout, objectives=(Objective("solo", 4, 0),), dim=4)
    assert other.names == ("solo",)
    assert other.dims == (4,)
    assert other.offsets == (0,)
    assert layout.names == ("semantic", "entity", "intent")
