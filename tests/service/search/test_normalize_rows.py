"""The micro-batch normalises request vectors per block, in float64, without overflow
(``normalize_blocks(..., prescale=True)``, as esp_retrieval.service.search.batching calls it)."""

from __future__ import annotations

import numpy as np

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 6, "entity": 3, "intent": 2})


def normalize_rows(x: np.ndarray, layout: SubspaceLayout) -> np.ndarray:
    return normalize_blocks(np.asarray(x, dtype=np.float64), layout, prescale=True)


def test_prescaled_matches_the_plain_normalisation() -> None:
    x = np.random.default_rng(0).standard_normal((5, LAYOUT.dim))
    np.testing.assert_allclose(normalize_rows(x, LAYOUT), normalize_blocks(x, LAYOUT), rtol=1e-12, atol=1e-15)


def test_each_row_alone_equals_the_row_in_a_batch() -> None:
    x = np.random.default_rng(1).standard_normal((7, LAYOUT.dim)) * 10.0 ** np.arange(-3, 4)[:, None]
    batch = normalize_rows(x, LAYOUT)
    for i in range(len(x)):
        assert np.array_equal(normalize_rows(x[i : i + 1], LAYOUT)[0], batch[i])


def test_huge_and_tiny_values_and_zero_blocks() -> None:
    x = np.zeros((3, LAYOUT.dim))
    x[0, :6] = 1e300  # squares would overflow without the peak scaling
    x[1, 6:9] = [5e-320, 0.0, -5e-320]  # subnormal
    x[2, 9:] = [3.0, -4.0]
    out = normalize_rows(x, LAYOUT)
    assert out.dtype == np.float64
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[0, :6], 1 / np.sqrt(6))
    np.testing.assert_allclose(out[1, 6:9], [2**-0.5, 0.0, -(2**-0.5)])
    np.testing.assert_allclose(out[2, 9:], [0.6, -0.8])
    for row, live in ((0, slice(0, 6)), (1, slice(6, 9)), (2, slice(9, 11))):
        dead = np.ones(LAYOUT.dim, dtype=bool)
        dead[live] = False
        assert not out[row, dead].any()  # blocks sent as zero stay zero
