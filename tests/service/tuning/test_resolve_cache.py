"""Registry.resolve builds a fixed source's weights once per layout; results stay what they were."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.service.tuning import Registry
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims(
    {"semantic": 16, "entity": 8, "intent": 8},
    default_weights={"semantic": 1.0, "entity": 0.5, "intent": 0.25},
)
DOC: dict[str, Any] = {
    "version": 1,
    "operating_points": {"entity_heavy": {"weights": {"semantic": 0.2, "entity": 0.8, "intent": 0.0}}},
    "experiments": {
        "ent": {
            "salt": "ent-v1",
            "traffic": 0.5,
            "default_arm": "control",
            "arms": [{"name": "control", "share": 1.0, "operating_point": "entity_heavy"}],
        }
    },
}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, [1.0, 0.5, 0.25]),
        ({"operating_point": "entity_heavy"}, [0.2, 0.8, 0.0]),
        ({"experiment": "ent", "unit_id": "u1"}, [0.2, 0.8, 0.0]),
    ],
)
def test_repeated_resolves_give_equal_independent_answers(
    kwargs: dict[str, Any], expected: list[float]
) -> None:
    registry = Registry.parse(DOC, LAYOUT)
    first = registry.resolve(LAYOUT, **kwargs)
    first.weights_used["semantic"] = 123.0  # a caller's copy: must not leak into the next answer
    second = registry.resolve(LAYOUT, **kwargs)
    np.testing.assert_array_equal(second.block_weights, expected)
    assert second.weights_used == dict(zip(LAYOUT.names, expected, strict=True))
    assert second.block_weights is first.block_weights  # built once
    with pytest.raises(ValueError, match="read-only"):
        second.block_weights[0] = 9.0  # shared by every request: nobody may scale it in place


def test_each_layout_gets_its_own_weights() -> None:
    """A bundle swap brings a new layout (here: same names, other defaults) under the same registry."""
    registry = Registry.empty(LAYOUT)
    other = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
    np.testing.assert_array_equal(registry.resolve(LAYOUT).block_weights, [1.0, 0.5, 0.25])
    np.testing.assert_array_equal(registry.resolve(other).block_weights, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(registry.resolve(LAYOUT).block_weights, [1.0, 0.5, 0.25])


def test_errors_are_not_cached() -> None:
    """A point that does not fit the caller's layout answers 503 each time, and a fitting layout still works."""
    registry = Registry.parse(DOC, LAYOUT)
    misfit = SubspaceLayout.from_dims({"semantic": 16, "other": 16})
    for _ in range(2):
        with pytest.raises(NotReadyError):
            registry.resolve(misfit, operating_point="entity_heavy")
    np.testing.assert_array_equal(
        registry.resolve(LAYOUT, operating_point="entity_heavy").block_weights, [0.2, 0.8, 0]
    )


def test_explicit_weights_are_resolved_per_request() -> None:
    registry = Registry.parse(DOC, LAYOUT)
    a = registry.resolve(LAYOUT, weights={"entity": 2.0})
    b = registry.resolve(LAYOUT, weights={"entity": 3.0})
    np.testing.assert_array_equal(a.block_weights, [1.0, 2.0, 0.25])
    np.testing.assert_array_equal(b.block_weights, [1.0, 3.0, 0.25])
