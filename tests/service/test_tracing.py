"""OpenTelemetry spans of POST /v1/search, captured by an in-memory exporter: one request span
with parse, queue wait, encode, engine and serialise under it, joined to the caller's trace."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.service.tracing import DISABLED, Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
STAGES = ["esp.search.parse", "esp.search.queue_wait", "esp.search.encode", "esp.search.engine",
          "esp.search.serialise"]


def _ready(client: TestClient) -> None:
    deadline = time.monotonic() + 120
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, client.get("/readyz").text
        time.sleep(0.1)


@pytest.fixture(scope="module")
def traced(tiny_bundle: Path) -> tuple[TestClient, InMemorySpanExporter]:
    settings = Settings(bundle=tiny_bundle, backend="numpy", threads=1, tracing=True)
    exporter = InMemorySpanExporter()
    app = create_app(settings)
    app.state.search.tracing = Tracing.from_settings(settings, exporter=exporter)
    with TestClient(app) as client:
        _ready(client)
        yield client, exporter


def test_a_search_is_one_span_tree_in_the_callers_trace(traced) -> None:
    client, exporter = traced
    exporter.clear()
    r = client.post("/v1/search", json={"queries": [{"text": "bank"}, {"vector": [1.0] * 32}], "k": 3},
                    headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200, r.text
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"esp.search", *STAGES}
    root = spans["esp.search"]
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"  # the caller's span
    for name in STAGES:
        s = spans[name]
        assert s.parent.span_id == root.context.span_id, name
        assert root.start_time <= s.start_time <= s.end_time <= root.end_time, name
    q, e, g = spans["esp.search.queue_wait"], spans["esp.search.encode"], spans["esp.search.engine"]
    assert q.end_time <= e.start_time <= e.end_time <= g.start_time  # the batch's order
    assert g.attributes["esp.backend"] == "numpy" and g.attributes["esp.batch_size"] == 2
    assert e.attributes["esp.texts"] == 1
    assert spans["esp.search.parse"].attributes["esp.body_bytes"] > 0


def test_vector_queries_have_no_encode_span_and_a_trace_of_their_own(traced) -> None:
    client, exporter = traced
    exporter.clear()
    assert client.post("/v1/search", json={"queries": [{"vector": [1.0] * 32}]}).status_code == 200
    names = [s.name for s in exporter.get_finished_spans()]
    assert "esp.search.encode" not in names and "esp.search.engine" in names
    root = next(s for s in exporter.get_finished_spans() if s.name == "esp.search")
    assert root.parent is None
    exporter.clear()
    assert client.get("/v1/layout").status_code == 200  # only searches are traced
    assert exporter.get_finished_spans() == ()


def test_off_by_default() -> None:
    assert Tracing.from_settings(Settings()) is DISABLED
    assert not DISABLED.enabled and DISABLED.stages() is None
    with DISABLED.span("x") as span:
        assert span is None
