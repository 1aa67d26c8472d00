"""The numpy backend's chunk products agree with a float64 product at every batch shape it
takes: one query (row-dot kernel), few (corpus-major, transposed), many (query-major), staged
or not, float32 and float16 storage, chunks of a corpus that does not divide evenly."""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from esp_retrieval.subspace.layout import SubspaceLayout


def _backend(precision: str) -> tuple[NumpyBackend, np.ndarray]:
    rng = np.random.default_rng(3)
    corpus = rng.standard_normal((1500, 40)).astype(np.float32)
    layout = SubspaceLayout.from_dims({"a": 24, "b": 16})
    return NumpyBackend(corpus, layout, precision=precision, threads=1), corpus


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("nq", [1, 2, NumpyBackend.corpus_major_batches, NumpyBackend.corpus_major_batches + 1, 70])
def test_chunk_scores_match_float64(precision: str, nq: int) -> None:
    engine, corpus = _backend(precision)
    stored = corpus.astype(np.float16).astype(np.float64) if precision == "float16" else corpus.astype(np.float64)
    queries = np.random.default_rng(nq).standard_normal((nq, 40)).astype(np.float32)
    for start, stop in [(0, 1024), (1024, 1500), (700, 701)]:
        out = np.empty((nq, stop - start), np.float32)
        got = engine._chunk_scores(queries, start, stop, out)
        want = queries.astype(np.float64) @ stored[start:stop].T
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
