"""DWA (Liu et al. 2019) on a scripted loss history; equal and static weighting."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.training.weighting import build_weighting


def test_dwa_matches_formula_on_scripted_history() -> None:
    dwa = build_weighting("dwa", ["a", "b", "c"], window=2, temperature=2.0)
    # window means: w0 = [4, 2, 1], w1 = [2, 2, 0.5], w2 = [1, 1.5, 0.5]
    script = [[5, 2, 1], [3, 2, 1], [2, 1, 0.5], [2, 3, 0.5], [1, 1, 0.25], [1, 2, 0.75]]
    seen = []
    for losses in script:
        seen.append(dwa.weights())
        dwa.update(losses)
    for w in seen[:4]:  # the first two windows are uniform
        np.testing.assert_array_equal(w, np.ones(3))
    r = np.array([2 / 4, 2 / 2, 0.5 / 1])
    expected = 3 * np.exp(r / 2) / np.exp(r / 2).sum()
    np.testing.assert_allclose(seen[4], expected, rtol=1e-12)
    np.testing.assert_allclose(seen[5], expected, rtol=1e-12)
    r2 = np.array([1 / 2, 1.5 / 2, 0.5 / 0.5])
    np.testing.assert_allclose(dwa.weights(), 3 * np.exp(r2 / 2) / np.exp(r2 / 2).sum(), rtol=1e-12)
    assert dwa.weights().sum() == pytest.approx(3.0)
    assert dwa.weights()[2] > dwa.weights()[0]  # the task whose loss fell least gets most weight


def test_equal_and_static() -> None:
    np.testing.assert_array_equal(build_weighting("equal", ["a", "b"]).weights(), [1.0, 1.0])
    np.testing.assert_array_equal(
        build_weighting("static", ["a", "b"], weights={"b": 10}).weights(), [1.0, 10.0]
    )
    with pytest.raises(ValueError, match="unknown task.*valid: \\['a', 'b'\\]"):
        build_weighting("static", ["a", "b"], weights={"c": 1})
    with pytest.raises(ValueError, match="finite number >= 0"):
        build_weighting("static", ["a"], weights={"a": -1})
    with pytest.raises(ValueError, match="allowed: \\[.*'dwa'.*'equal'.*'static'.*\\]"):
        build_weighting("no_such_weighting", ["a"])
    with pytest.raises(ValueError, match="window"):
        build_weighting("dwa", ["a"], window=0)
