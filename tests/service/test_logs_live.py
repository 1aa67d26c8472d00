"""Structured logs of the live server: JSON lines carrying the request id that the response
echoes in ``X-Request-ID`` (the caller's when it sent a plain one), uvicorn's access log in the
same format; ``ESP_LOG_FORMAT=text`` for a terminal. Also the process and GC series."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.live_server import LiveServer
from esp_retrieval.service.logs import redact_path
from esp_retrieval.service.metrics import PROCESS_METRIC_NAMES
from tests.live_fixtures import vectors_only


def _records(server: LiveServer) -> list[dict]:
    """Every line of the server's output as JSON (a line that is not JSON fails the test)."""
    out = []
    for line in server.log().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def test_json_lines_carry_the_request_id_the_response_echoes(vectors_served: LiveServer) -> None:
    given = "caller-id.42"
    r = httpx.post(f"{vectors_served.url}/v1/search", json={"queries": [{"vector": [1.0] * 32}], "k": 2},
                   headers={"X-Request-ID": given}, timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == given
    bad = httpx.get(f"{vectors_served.url}/v1/layout", headers={"X-Request-ID": "no spaces allowed"}, timeout=30)
    made = bad.headers["x-request-id"]
    assert made != "no spaces allowed" and len(made) == 32
    missing = httpx.post(f"{vectors_served.url}/v1/search", json={"queries": []}, timeout=30)
    assert missing.status_code == 422 and len(missing.headers["x-request-id"]) == 32

    def access_line(request_id: str) -> dict:
        for _ in range(50):  # the access line is written right after the response starts
            lines = [x for x in _records(vectors_served)
                     if x.get("request_id") == request_id and x["logger"] == "uvicorn.access"]
            if lines:
                return lines[0]
        raise AssertionError(f"no access line for {request_id}")

    line = access_line(given)
    assert (line["method"], line["path"], line["status"], line["level"]) == ("POST", "/v1/search", 200, "INFO")
    assert line["time"].endswith("+00:00")
    assert access_line(made)["path"] == "/v1/layout"
    assert access_line(missing.headers["x-request-id"])["status"] == 422
    # the service's own lines (bundle loading) are JSON too, outside any request
    assert any(x["logger"].startswith("esp_retrieval.service.") and x["request_id"] is None for x in _records(vectors_served))


def test_no_unit_id_reaches_the_access_log(vectors_served: LiveServer) -> None:
    """A unit id is a user's or a session's id: the assignment route's query holds one."""
    unit = "user-4711-secret"
    r = httpx.get(f"{vectors_served.url}/v1/experiments/ent/assignment", params={"unit_id": unit},
                  headers={"X-Request-ID": "assign-1"}, timeout=30)
    assert r.status_code == 200 and r.json()["unit_id"] == unit
    encoded = httpx.get(f"{vectors_served.url}/v1/experiments/ent/assignment?unit%5Fid={unit}x", timeout=30)
    assert encoded.status_code == 200
    for _ in range(50):  # the access line is written right after the response starts
        lines = [x for x in _records(vectors_served) if x.get("request_id") == "assign-1"]
        if lines:
            break
    assert lines[0]["path"] == "/v1/experiments/ent/assignment?unit_id=REDACTED"
    assert "unit_id=REDACTED" in lines[0]["message"]
    assert unit not in vectors_served.log()
    assert redact_path("/a?k=1&unit_id=u&x=unit_id&unit%5Fid=v") == "/a?k=1&unit_id=REDACTED&x=unit_id&unit%5Fid=REDACTED"
    assert redact_path("/v1/layout") == "/v1/layout"


def test_process_and_gc_metrics_are_exposed(vectors_served: LiveServer) -> None:
    text = httpx.get(f"{vectors_served.url}/metrics", timeout=30).text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert set(PROCESS_METRIC_NAMES) <= names, set(PROCESS_METRIC_NAMES) - names
    rss = next(float(x.split()[1]) for x in text.splitlines() if x.startswith("process_resident_memory_bytes"))
    assert rss > 10e6  # a process holding torch and a bundle


def test_text_format_for_a_terminal(
    served_bundle: Path, server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = server_factory(vectors_only(served_bundle, tmp_path / "b"), log_format="text")
    r = httpx.get(f"{server.url}/readyz", headers={"X-Request-ID": "plain-7"}, timeout=30)
    assert r.headers["x-request-id"] == "plain-7"
    server.stop()
    lines = server.log().splitlines()
    mine = [x for x in lines if "[plain-7]" in x]
    assert mine and "GET /readyz" in mine[0] and not mine[0].startswith("{")
    assert any(" INFO esp_retrieval.service." in x and "[-]" in x for x in lines)
