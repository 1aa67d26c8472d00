"""An engine is released once nothing uses it: no pool thread keeps it alive, a retired state
closes it after its last user (the reload leak: every reload kept the old engine and its threads)."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.service.engine import create_engine
from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"a": 8, "b": 8})


def _corpus(n: int = 4096) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, LAYOUT.dim)).astype(np.float32)
    return normalize_blocks(x, LAYOUT)


def _pool_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def _search(engine: object, nq: int = 8) -> None:
    q = _corpus(nq)
    engine.search(q, np.ones(2), 5)  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_an_unreferenced_engine_is_collected_and_its_threads_end(backend: str) -> None:
    engine = create_engine(backend, _corpus(), LAYOUT, threads=2, chunk_rows=256)
    _search(engine)
    assert engine._pool is not None  # type: ignore[attr-defined]  # the scan used its worker pool
    ref = weakref.ref(engine)
    pool_threads = list(engine._pool._threads)  # type: ignore[attr-defined]
    del engine
    gc.collect()
    assert ref() is None, "the engine is still referenced (by its pool's threads?)"
    for t in pool_threads:
        t.join(timeout=10)
        assert not t.is_alive()


def test_a_retired_state_closes_its_engine_after_the_last_user(tmp_path: Path) -> None:
    path = write_bundle(tmp_path / "b", LAYOUT, _corpus(), [f"d{i}" for i in range(4096)])
    bundle = read_bundle(path, snapshot=True)
    engine = create_engine("numpy", bundle.embeddings, LAYOUT, threads=2, chunk_rows=256)
    state = ServingState(bundle=bundle, engine=engine, encoder=None, docs=None)
    assert state.acquire()
    _search(engine)
    threads = list(engine._pool._threads)  # type: ignore[attr-defined]
    state.retire()
    assert not state.closed and engine._pool is not None  # type: ignore[attr-defined]  # still held
    _search(engine)  # ... and can still search
    state.release()
    assert state.closed and engine._pool is None
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
    assert not state.acquire()  # nobody starts on a closed state
    state.retire()  # idempotent


def test_a_state_retired_with_no_user_closes_at_once(tmp_path: Path) -> None:
    path = write_bundle(tmp_path / "b", LAYOUT, _corpus(512), [f"d{i}" for i in range(512)])
    bundle = read_bundle(path, snapshot=True)
    engine = create_engine("faiss", bundle.embeddings, LAYOUT, threads=1)
    state = ServingState(bundle=bundle, engine=engine, encoder=None, docs=None)
    assert engine.index.ntotal == 512  # type: ignore[attr-defined]
    state.retire()
    assert state.closed and engine.index.ntotal == 0  # type: ignore[attr-defined]  # faiss's copy freed
