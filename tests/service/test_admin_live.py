"""Admin routes: bearer token compared in constant time, 401/403/404, token never echoed or logged."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from bench.live_server import LiveServer
from esp_retrieval.client.client import ESPClient, ESPError
from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from tests.live_fixtures import rebundle


def test_missing_and_malformed_tokens_are_401(served: LiveServer) -> None:
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": f"Basic {served.token}"}):
        r = httpx.post(f"{served.url}/v1/admin/reload", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["type"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        assert served.token not in r.text


def test_wrong_token_is_403_and_not_echoed(served: LiveServer) -> None:
    assert served.token is not None
    wrong = served.token[:-1] + ("x" if served.token[-1] != "x" else "y")
    r = httpx.post(f"{served.url}/v1/admin/reload", headers={"Authorization": f"Bearer {wrong}"})
    assert r.status_code == 403
    assert r.json()["type"] == "forbidden"
    assert wrong not in r.text
    assert served.token not in r.text


def test_reload_same_bundle_and_refused_bundle(served: LiveServer, tmp_path: Path) -> None:
    with ESPClient(served.url, admin_token=served.token) as c:
        failures_before = _reload_failures(c.metrics())
        before = c.ready().bundle_version
        res = c.reload()
        assert res.bundle_version == before
        assert res.previous_version == before
        bad = rebundle(served.bundle, tmp_path / "bad", seed=5, corrupt=True)
        with pytest.raises(ESPError) as err:
            c.reload(str(bad))
        assert err.value.status == 409
        assert err.value.type == "reload_failed"
        assert "embeddings.npy: sha256 mismatch" in err.value.message
        assert before in err.value.message  # says what is still served
        assert c.ready().bundle_version == before
        assert c.search([[1.0] * 32], k=1).bundle_version == before
        with pytest.raises(ESPError) as err:
            c.reload(str(tmp_path / "does-not-exist"))
        assert err.value.status == 409
        assert "manifest.json: missing" in err.value.message
        metrics = c.metrics()
    assert _reload_failures(metrics) == failures_before + 2


def _reload_failures(metrics: str) -> float:
    prefix = 'esp_bundle_reloads_total{result="failure"} '
    return float(next(line for line in metrics.splitlines() if line.startswith(prefix))[len(prefix) :])


def test_token_never_appears_in_the_server_log(served: LiveServer) -> None:
    assert served.token is not None
    httpx.post(f"{served.url}/v1/admin/reload", headers={"Authorization": f"Bearer {served.token}"})
    httpx.post(f"{served.url}/v1/admin/reload", headers={"Authorization": f"Bearer {served.token}zz"})
    log = served.log()
    assert "/v1/admin/reload" in log  # the access log is on, so the check means something
    assert served.token not in log


def test_admin_routes_are_404_without_a_configured_token() -> None:
    with TestClient(create_app(Settings(bundle=None, admin_token=None))) as c:
        r = c.post("/v1/admin/reload", headers={"Authorization": "Bearer anything"})
        assert r.status_code == 404
        assert r.json()["type"] == "not_found"
        assert "disabled" in r.json()["message"]
        r = c.post("/v1/search", json={"queries": [{"vector": [1.0]}]})
        assert r.status_code == 503
        assert r.json()["type"] == "not_ready"
        assert c.get("/readyz").status_code == 503
        assert c.get("/healthz").status_code == 200
