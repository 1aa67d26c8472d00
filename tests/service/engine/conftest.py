"""Seeded synthetic corpora and a float64 brute-force reference for the engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import pytest

from esp_retrieval.service.engine import BACKENDS, Backend, BackendUnavailable
from esp_retrieval.service.engine.cupy_backend import CupyBackend
from esp_retrieval.subspace.engine.array_scan import ArrayScanBackend
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores

LAYOUTS = {
    "three": {"semantic": 24, "entity": 12, "intent": 4},
    "one": {"all": 16},
    "uneven": {"a": 3, "b": 17, "c": 1, "d": 9},
}



class CupyOnNumpy(CupyBackend):
    """The ``cupy`` backend's own code with numpy as its array module (test-only).

    Everything but the device: float16 queries times the float16 corpus with float32
    accumulation and float16 scores (numpy's float16 matmul rounds as cuBLAS ``gemmEx`` does
    here), the completeness bound for it, and the selection by ``torch.topk`` over DLPack.
    """

    name: ClassVar[str] = "cupy-on-numpy"
    workspace_bytes: ClassVar[int] = 1 << 20

    def _require(self) -> None:
        pass

    def _array_module(self) -> ModuleType:
        return np

    def _to_host(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def _torch_for_selection(self) -> Any:
        import torch

        return torch  # torch.topk on the CPU, over the same DLPack hand-off as on CUDA

    def _stable_argsort(self, x: np.ndarray) -> np.ndarray:
        return np.argsort(x, axis=1, kind="stable")


#: every registered backend, plus the GPU backend's array code on numpy (test-only: the CPU
#: suite runs the scan, selection, bound and re-rank code that ``cupy`` runs on a device)
ENGINES: dict[str, type[Backend]] = {
    **BACKENDS,
    ArrayScanBackend.name: ArrayScanBackend,
    CupyOnNumpy.name: CupyOnNumpy,
}


def layout_of(name: str) -> SubspaceLayout:
    return SubspaceLayout.from_dims(LAYOUTS[name])


def random_rows(n: int, layout: SubspaceLayout, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return normalize_blocks(rng.standard_normal((n, layout.dim)).astype(np.float32), layout)


def reference_topk(
    queries: np.ndarray, corpus: np.ndarray, weights: np.ndarray, layout: SubspaceLayout, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 per-block loop + a stable sort: ``(rows, scores)``, ties -> lower row."""
    s = reference_scores(queries, corpus, weights, layout)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(s, order, 1)


def tied_corpus() -> tuple[SubspaceLayout, np.ndarray, np.ndarray, np.ndarray]:
    """Exact ties everywhere: entries in {0, +-1/2} and power-of-two weights add up exactly.

    Each block has four entries of +-1/2 (norm 1), drawn from 12 patterns, so many of the 900
    rows are duplicates and the k-th score is shared by rows on both sides of the cut.
    Returns ``(layout, corpus, queries (3), weights (3, K))``.
    """
    layout = layout_of("three")
    rng = np.random.default_rng(6)
    patterns = np.zeros((12, layout.dim), np.float32)
    for p in patterns:
        for obj in layout:
            cols = rng.choice(np.arange(obj.offset, obj.end), size=min(4, obj.dim), replace=False)
            p[cols] = rng.choice([-0.5, 0.5], size=len(cols))
    corpus = patterns[rng.integers(0, len(patterns), 900)]
    weights = np.array([[1.0, 0.5, 2.0], [1.0, 1.0, 1.0], [0.25, 0.0, 4.0]])
    return layout, corpus, patterns[[0, 3, 7]], weights


def startable() -> list[tuple[str, str]]:
    """(backend, precision) pairs that can start on this machine."""
    layout = layout_of("one")
    corpus = random_rows(4, layout, 0)
    pairs = []
    for name, cls in ENGINES.items():
        for precision in cls.precisions:
            try:
                engine = cls(corpus, layout, precision=precision)
            except BackendUnavailable:
                continue
            getattr(engine, "close", lambda: None)()
            pairs.append((name, precision))
    return pairs


STARTABLE = startable()
IDS = [f"{b}-{p}" for b, p in STARTABLE]


@pytest.fixture
def make_engine() -> Iterator[object]:
    """``make_engine(name, corpus, layout, **kw)``; closes the engines' worker pools afterwards."""
    made: list[Backend] = []

    def make(name: str, corpus: np.ndarray, layout: SubspaceLayout, **kw: object) -> Backend:
        engine = ENGINES[name](corpus, layout, **kw)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    for e in made:
        getattr(e, "close", lambda: None)()
