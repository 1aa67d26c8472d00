"""The one-GEMM weighted score equals an explicit per-block loop; top-k order and ties."""

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import (
    normalize_blocks,
    reference_scores,
    scale_queries,
    subspace_scores,
    topk,
    weighted_scores,
)


@st.composite
def problems(draw: st.DrawFn) -> tuple[SubspaceLayout, np.ndarray, np.ndarray, np.ndarray]:
    dims = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    layout = SubspaceLayout.from_dims({f"s{i}": d for i, d in enumerate(dims)})
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    nq, n = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    q = normalize_blocks(rng.standard_normal((nq, layout.dim)).astype(np.float32), layout)
    d = normalize_blocks(rng.standard_normal((n, layout.dim)).astype(np.float32), layout)
    per_row = draw(st.booleans())
    w = rng.uniform(0, 3, size=(nq, len(layout)) if per_row else len(layout))
    w = np.where(rng.random(w.shape) < 0.2, 0.0, w)  # some zero weights
    return layout, q, d, w


@seed(20261130)
@settings(max_examples=200, deadline=None, derandomize=True)
@given(problems())
def test_one_gemm_equals_per_block_loop(problem: tuple) -> None:
    layout, q, d, w = problem
    gemm = weighted_scores(scale_queries(q, layout.expand(w)), d)
    np.testing.assert_allclose(gemm, reference_scores(q, d, w, layout), atol=1e-5)


def test_normalize_blocks_unit_norm_per_block_and_zero_block_stays_zero() -> None:
    layout = SubspaceLayout.from_dims({"a": 3, "b": 2})
    x = np.array([[3.0, 4.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 2.0, 0.0]], dtype=np.float32)
    y = normalize_blocks(x, layout)
    np.testing.assert_allclose(y[0], [0.6, 0.8, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(np.linalg.norm(y[1, :3]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[1, 3:], [1.0, 0.0])
    assert y.dtype == np.float32 and not np.isnan(y).any()
    with pytest.raises(ValueError, match="vectors have 4 columns, the layout has 5"):
        normalize_blocks(np.zeros((1, 4), np.float32), layout)


def test_normalize_blocks_equals_per_block_division_with_and_without_prescale() -> None:
    layout = SubspaceLayout.from_dims({"a": 5, "b": 1, "c": 3})
    x = np.random.default_rng(2).standard_normal((6, layout.dim)) * 10.0 ** np.arange(-2, 4)[:, None]
    expect = np.concatenate(
        [
            x[:, o.offset : o.end] / np.linalg.norm(x[:, o.offset : o.end], axis=1, keepdims=True)
            for o in layout.objectives
        ],
        axis=1,
    )
    for prescale in (False, True):
        np.testing.assert_allclose(normalize_blocks(x, layout, prescale=prescale), expect, rtol=1e-13)
        y = normalize_blocks(x.astype(np.float32), layout, prescale=prescale)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, expect, rtol=1e-6)
    np.testing.assert_array_equal(
        normalize_blocks(x[0], layout), normalize_blocks(x[:1], layout)[0]
    )  # (D,) too


def test_topk_descending_with_ties_broken_by_lower_index() -> None:
    scores = np.array([[0.5, 0.9, 0.5, 0.1, 0.9, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    vals, idx = topk(scores, 3)
    assert idx.tolist() == [[1, 4, 0], [0, 1, 2]]
    np.testing.assert_array_equal(vals, [[0.9, 0.9, 0.5], [1.0, 1.0, 1.0]])
    vals, idx = topk(scores, 10)  # k > N returns N hits
    assert idx.shape == (2, 6)
    assert idx[0].tolist() == [1, 4, 0, 2, 5, 3]
    with pytest.raises(ValueError, match="k must be >= 1"):
        topk(scores, 0)


def test_topk_matches_stable_sort_on_random_ties() -> None:
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 5, size=(20, 50)).astype(np.float32)  # many ties
    for k in (1, 7, 49, 50):
        _, idx = topk(scores, k)
        expect = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(idx, expect)


def test_subspace_scores_are_block_cosines_of_hits() -> None:
    layout = SubspaceLayout.from_dims({"a": 4, "b": 3, "c": 2})
    rng = np.random.default_rng(3)
    q = normalize_blocks(rng.standard_normal((2, 9)).astype(np.float32), layout)
    d = normalize_blocks(rng.standard_normal((30, 9)).astype(np.float32), layout)
    w = np.array([[1.0, 0.0, 2.0], [0.3, 0.3, 0.4]])
    vals, rows = topk(weighted_scores(scale_queries(q, layout.expand(w)), d), 5)
    per = subspace_scores(q, d, rows, layout)
    assert per.shape == (2, 5, 3)
    for i in range(2):
        for j, r in enumerate(rows[i]):
            for k, obj in enumerate(layout.objectives):
                sl = slice(obj.offset, obj.end)
                assert per[i, j, k] == pytest.approx(float(q[i, sl] @ d[r, sl]), abs=1e-6)
    np.testing.assert_allclose((per * w[:, None, :]).sum(-1), vals, atol=1e-5)
