"""The micro-batcher: gathers concurrent jobs into one engine call, per-row weights, 429, drain."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from esp_retrieval.service.engine import create_engine
from esp_retrieval.service.errors import STATUS, NotReadyError, OverloadedError, error_headers, error_kind
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.search.batching import MicroBatcher, QueryInput
from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 12, "entity": 4})


class CountingEngine:
    """The real engine, counting calls and (optionally) held at a gate to build up a queue."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.name = engine.name
        self.capabilities = engine.capabilities
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def search(self, queries: np.ndarray, block_weights: np.ndarray, k: int) -> Any:
        self.entered.set()
        self.gate.wait(timeout=30)
        self.calls.append(len(queries))
        return self.engine.search(queries, block_weights, k)


def _state(tmp_path: Path, seed: int = 0) -> ServingState:
    rng = np.random.default_rng(seed)
    emb = normalize_blocks(rng.standard_normal((300, LAYOUT.dim)).astype(np.float32), LAYOUT)
    path = write_bundle(tmp_path / f"b{seed}", LAYOUT, emb, [f"d{i}" for i in range(300)])
    bundle = read_bundle(path)
    engine = CountingEngine(create_engine("numpy", bundle.embeddings, LAYOUT, threads=1))
    return ServingState(bundle=bundle, engine=engine, encoder=None, docs=None)  # type: ignore[arg-type]


def _vectors(n: int, seed: int) -> list[QueryInput]:
    rng = np.random.default_rng(seed)
    q = normalize_blocks(rng.standard_normal((n, LAYOUT.dim)).astype(np.float32), LAYOUT)
    return [QueryInput(vector=row) for row in q]


def _batcher(metrics: Metrics, **kw: Any) -> MicroBatcher:
    opts: dict[str, Any] = {"max_batch": 64, "max_wait_ms": 50.0, "queue_size": 64, "gather": True}
    opts.update(kw)
    return MicroBatcher(metrics, **opts)


def test_concurrent_jobs_share_one_engine_call_with_per_row_weights(tmp_path: Path) -> None:
    state = _state(tmp_path)
    weights = [np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([0.5, 2.0])]
    jobs = [_vectors(2, seed=i) for i in range(3)]

    async def run() -> list[Any]:
        b = _batcher(Metrics())
        await b.start()
        state.engine.gate.clear()  # type: ignore[attr-defined]
        first = asyncio.create_task(b.submit(state, _vectors(1, 99), weights[0], 3))
        await asyncio.to_thread(state.engine.entered.wait, 10)  # type: ignore[attr-defined]
        # The worker is busy with `first`: these three queue up and must go as one batch.
        tasks = [
            asyncio.create_task(b.submit(state, j, w, k))
            for j, w, k in zip(jobs, weights, (3, 5, 4), strict=True)
        ]
        await asyncio.sleep(0.05)
        state.engine.gate.set()  # type: ignore[attr-defined]
        out = await asyncio.gather(first, *tasks)
        await b.stop()
        return out[1:]

    results = asyncio.run(run())
    assert state.engine.calls == [1, 6]  # type: ignore[attr-defined]
    engine = state.engine.engine  # type: ignore[attr-defined]
    for job, w, k, res in zip(jobs, weights, (3, 5, 4), results, strict=True):
        alone = engine.search(np.stack([q.vector for q in job]), w, k)
        assert len(res) == len(job)
        for i, hits in enumerate(res):
            assert hits.rows.tolist() == alone.rows[i].tolist()
            np.testing.assert_allclose(hits.scores, alone.scores[i], rtol=1e-6)
            assert hits.subspace_scores.shape == (k, 2)


def test_without_gathering_each_request_is_its_own_engine_call(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), gather=False)
        await b.start()
        state.engine.gate.clear()  # type: ignore[attr-defined]
        tasks = [asyncio.create_task(b.submit(state, _vectors(2, s), np.ones(2), 3)) for s in range(3)]
        await asyncio.sleep(0.05)
        state.engine.gate.set()  # type: ignore[attr-defined]
        await asyncio.gather(*tasks)
        await b.stop()

    asyncio.run(run())
    assert state.engine.calls == [2, 2, 2]  # type: ignore[attr-defined]


def test_full_queue_is_429_with_retry_after_and_queue_recovers(tmp_path: Path) -> None:
    state = _state(tmp_path)
    metrics = Metrics()

    async def run() -> None:
        b = _batcher(metrics, queue_size=4, max_wait_ms=0)
        await b.start()
        state.engine.gate.clear()  # type: ignore[attr-defined]
        busy = asyncio.create_task(b.submit(state, _vectors(1, 0), np.ones(2), 1))
        await asyncio.to_thread(state.engine.entered.wait, 10)  # type: ignore[attr-defined]
        queued = asyncio.create_task(b.submit(state, _vectors(3, 1), np.ones(2), 1))
        await asyncio.sleep(0.01)
        assert b.depth == 3
        assert metrics.queue_depth._value.get() == 3
        with pytest.raises(OverloadedError) as err:
            await b.submit(state, _vectors(2, 2), np.ones(2), 1)
        assert STATUS[error_kind(err.value)] == 429
        assert error_headers(err.value)["Retry-After"] == "1"
        state.engine.gate.set()  # type: ignore[attr-defined]
        await asyncio.gather(busy, queued)
        assert len(await b.submit(state, _vectors(4, 3), np.ones(2), 1)) == 4  # room again
        await b.stop()

    asyncio.run(run())


def test_jobs_of_two_states_are_scored_each_on_its_own(tmp_path: Path) -> None:
    old, new = _state(tmp_path, seed=0), _state(tmp_path, seed=1)
    q = _vectors(1, 5)

    async def run() -> tuple[Any, Any]:
        b = _batcher(Metrics())
        await b.start()
        a, c = await asyncio.gather(b.submit(old, q, np.ones(2), 3), b.submit(new, q, np.ones(2), 3))
        await b.stop()
        return a, c

    a, c = asyncio.run(run())
    assert a[0].rows.tolist() == old.engine.engine.search(q[0].vector[None], np.ones(2), 3).rows[0].tolist()  # type: ignore[attr-defined]
    assert c[0].rows.tolist() == new.engine.engine.search(q[0].vector[None], np.ones(2), 3).rows[0].tolist()  # type: ignore[attr-defined]
    assert old.engine.calls == [1] and new.engine.calls == [1]  # type: ignore[attr-defined]


def test_an_engine_failure_fails_only_its_jobs_and_the_batcher_keeps_serving(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), max_wait_ms=0)
        await b.start()
        with pytest.raises(ValueError):
            await b.submit(state, _vectors(1, 0), np.ones(3), 2)  # wrong K: the batch fails
        assert len(await b.submit(state, _vectors(1, 0), np.ones(2), 2)) == 1
        await b.stop()

    asyncio.run(run())


def test_stop_answers_queued_jobs_before_closing(tmp_path: Path) -> None:
    state = _state(tmp_path)

    async def run() -> None:
        b = _batcher(Metrics(), max_wait_ms=0)
        await b.start()
        state.engine.gate.clear()  # type: ignore[attr-defined]
        tasks = [asyncio.create_task(b.submit(state, _vectors(1, s), np.ones(2), 2)) for s in range(4)]
        await asyncio.sleep(0.02)
        stopping = asyncio.create_task(b.stop())
        await asyncio.sleep(0.02)
        with pytest.raises(NotReadyError) as err:
            await b.submit(state, _vectors(1, 9), np.ones(2), 2)
        assert STATUS[error_kind(err.value)] == 503
        state.engine.gate.set()  # type: ignore[attr-defined]
        results = await asyncio.gather(*tasks)
        await stopping
        assert all(len(r) == 1 for r in results)

    asyncio.run(run())


def test_the_window_is_used_only_when_recent_arrivals_say_a_job_is_due() -> None:
    b = _batcher(Metrics(), max_wait_ms=2.0)
    now = 1000.0
    assert not b.worth_waiting(now)  # no history: sparse traffic goes at once
    b._arrivals.extend(now - 0.010 * i for i in range(8, -1, -1))  # one closed-loop caller, 10 ms apart
    assert not b.worth_waiting(now)
    b._arrivals.extend(now + 0.0001 * i for i in range(1, 20))  # a burst: 0.1 ms apart
    assert b.worth_waiting(now + 0.002)
    assert not b.worth_waiting(now + 1.0)  # all of it is old news


def test_a_lone_caller_does_not_wait_and_a_busy_one_gathers(tmp_path: Path) -> None:
    state = _state(tmp_path)
    w = np.array([1.0, 1.0])

    async def run(busy: bool) -> None:
        b = _batcher(Metrics(), max_wait_ms=300.0)
        await b.start()
        if busy:  # recent arrivals 1 ms apart: another job is due within the window
            b._arrivals.extend(time.monotonic() - 0.001 * i for i in range(10, 0, -1))
        first = asyncio.create_task(b.submit(state, _vectors(1, 1), w, 3))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(b.submit(state, _vectors(1, 2), w, 3))
        await asyncio.gather(first, second)
        await b.stop()

    asyncio.run(run(busy=False))
    assert state.engine.calls == [1, 1]  # type: ignore[attr-defined]
    state.engine.calls.clear()  # type: ignore[attr-defined]
    asyncio.run(run(busy=True))
    assert state.engine.calls == [2]  # type: ignore[attr-defined]
