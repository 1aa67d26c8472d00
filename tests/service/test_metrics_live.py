"""``/metrics`` exposes every series of esp_retrieval.service.metrics.METRIC_NAMES after a few requests."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.live_server import LiveServer
from esp_retrieval.client.client import ESPClient, ESPError
from esp_retrieval.service.metrics import METRIC_NAMES


def _families(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def _sample(fams: dict[str, list], name: str, **labels: str) -> float:
    for family in fams.values():
        for s in family:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_every_named_series_is_exported(served: LiveServer) -> None:
    with ESPClient(served.url) as c:
        c.search(["a text query", "another one"], k=3)
        c.search([[1.0] * 32], k=3, weights={"semantic": 0.3})
        c.search([[1.0] * 32], k=3, experiment="ent", unit_id="u-7")
        with pytest.raises(ESPError, match="422"):
            c.search([[1.0] * 31], k=3)
        text = c.metrics()
    fams = _families(text)
    # Counters are parsed without their _total suffix.
    exported = set(fams) | {f"{n}_total" for n in fams}
    missing = [n for n in METRIC_NAMES if n not in exported]
    assert not missing, f"missing series: {missing}"

    assert _sample(fams, "esp_requests_total", route="/v1/search", status="200") >= 3
    assert _sample(fams, "esp_requests_total", route="/v1/search", status="422") >= 1
    assert _sample(fams, "esp_request_duration_seconds_count", route="/v1/search") >= 4
    assert _sample(fams, "esp_encode_duration_seconds_count") >= 1
    assert _sample(fams, "esp_engine_duration_seconds_count", backend="numpy") >= 3
    assert _sample(fams, "esp_batch_size_count") >= 3
    assert _sample(fams, "esp_queue_capacity") > 0
    assert _sample(fams, "esp_queue_depth") == 0
    assert _sample(fams, "esp_index_documents") == 60
    assert _sample(fams, "esp_ready") == 1
    assert _sample(fams, "esp_bundle_info", backend="numpy") == 1
    assert _sample(fams, "esp_weights_requested_count", subspace="semantic") >= 4
    assert _sample(fams, "esp_weights_requested_bucket", subspace="semantic", le="0.3") >= 1
    arms = sum(
        _sample(fams, "esp_experiment_requests_total", experiment="ent", arm=a)
        for a in ("control", "treatment")
    )
    assert arms >= 1
    arm_latencies = sum(
        _sample(fams, "esp_experiment_request_duration_seconds_count", experiment="ent", arm=a)
        for a in ("control", "treatment")
    )
    assert arm_latencies >= 1


def test_route_labels_are_templates_not_raw_paths(served: LiveServer) -> None:
    httpx.get(f"{served.url}/v1/experiments/ent/assignment", params={"unit_id": "abc"})
    httpx.get(f"{served.url}/no/such/path/12345")
    fams = _families(httpx.get(f"{served.url}/metrics").text)
    routes = {s.labels["route"] for s in fams["esp_requests"] if "route" in s.labels}
    assert "/v1/experiments/{name}/assignment" in routes
    assert "unmatched" in routes
    assert not any("12345" in r or "abc" in r for r in routes)
