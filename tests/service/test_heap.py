"""The start-up heap is frozen once (esp_retrieval.service.heap), and that does not keep a retired bundle alive:
frozen objects are skipped by the cyclic collector, so a reference cycle in a served state would
outlive its retirement; the first bundle, frozen with the start-up heap, must still be freed."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from esp_retrieval.service import heap
from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings


@pytest.fixture(autouse=True)
def _thaw() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test process is not this server's heap


def _ready(c: TestClient) -> None:
    deadline = time.monotonic() + 60
    while c.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, c.get("/readyz").text
        time.sleep(0.02)


def test_settle_collects_then_freezes() -> None:
    gc.unfreeze()
    cycle: list[object] = []
    cycle.append(cycle)
    dead = weakref.ref(_Node(cycle))  # garbage in a cycle: only the collector frees it
    heap.settle()
    assert dead() is None
    assert gc.get_freeze_count() > 0


def test_the_first_bundle_is_frozen_with_the_heap_and_freed_when_retired(
    tiny_bundle: Path, tiny_bundle_factory: Callable[[str], Path]
) -> None:
    gc.unfreeze()
    second = tiny_bundle_factory("second")
    app = create_app(Settings(bundle=tiny_bundle, backend="numpy", admin_token="t0ken"))
    with TestClient(app) as c:
        _ready(c)
        assert gc.get_freeze_count() > 0
        first = app.state.holder.current
        engine, encoder = weakref.ref(first.engine), weakref.ref(first.encoder.model)
        del first
        r = c.post("/v1/admin/reload", json={"path": str(second)}, headers={"Authorization": "Bearer t0ken"})
        assert r.status_code == 200, r.text
        assert c.post("/v1/search", json={"queries": [{"text": "hello"}], "k": 2}).status_code == 200
        gc.collect()
        assert engine() is None and encoder() is None
        assert app.state.holder.current.engine is not None


class _Node:
    def __init__(self, ref: object) -> None:
        self.ref = ref
        self.me = self
