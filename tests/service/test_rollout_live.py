"""Fleet-wide rollout: three live replicas on loopback watch one registry file; the bundle it
names is served by all of them, and a corrupt (or mis-named) one is refused by every replica,
which keep serving the old one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bench.live_server import LiveServer
from esp_retrieval.service.rollout import manifest_sha256
from esp_retrieval.subspace.atomic import atomic_write_text
from esp_retrieval.subspace.bundle import read_bundle
from tests.live_fixtures import REGISTRY_DOC, vectors_only

POLL = 0.5


def name_bundle(registry: Path, bundle: Path, sha256: str | None = None) -> None:
    doc = {**REGISTRY_DOC, "bundle": {"path": str(bundle), "sha256": sha256 or manifest_sha256(bundle)}}
    atomic_write_text(registry, json.dumps(doc))


def readyz(server: LiveServer) -> dict:
    return httpx.get(f"{server.url}/readyz", timeout=10).json()


def metric(server: LiveServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return float(next(x.split()[-1] for x in text.splitlines() if x.startswith(name + " ")))


def wait_all(servers: list[LiveServer], check: Callable[[dict], bool], what: str, timeout: float = 120) -> float:
    """Seconds until ``check(readyz)`` holds on every replica."""
    t0 = time.monotonic()
    for s in servers:
        s.wait_until(lambda s=s: check(readyz(s)), timeout, what, interval=0.05)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def fleet(served_bundle: Path, module_server_factory: Callable[..., LiveServer],
          tmp_path_factory: pytest.TempPathFactory) -> tuple[list[LiveServer], Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("fleet")
    bundles = {
        "a": vectors_only(served_bundle, root / "a", seed=1),
        "b": vectors_only(served_bundle, root / "b", seed=2),
        "corrupt": vectors_only(served_bundle, root / "corrupt", seed=3, corrupt=True),
    }
    registry = root / "registry.json"
    name_bundle(registry, bundles["a"])
    servers = [module_server_factory(bundles["a"], registry=registry, registry_poll_seconds=POLL) for _ in range(3)]
    return servers, registry, bundles


def test_every_replica_serves_the_bundle_the_file_names_and_refuses_a_corrupt_one(fleet) -> None:
    servers, registry, bundles = fleet
    version = {k: read_bundle(p).version for k, p in bundles.items() if k != "corrupt"}
    wait_all(servers, lambda r: r["rollout"]["state"] == "in_sync", "in sync on bundle a")
    assert {readyz(s)["bundle_version"] for s in servers} == {version["a"]}
    assert all(metric(s, "esp_bundle_in_sync") == 1.0 for s in servers)

    name_bundle(registry, bundles["b"])
    seconds = wait_all(servers, lambda r: r["bundle_version"] == version["b"], "serving bundle b")
    print(json.dumps({"rollout_seconds_all_three": round(seconds, 2), "poll_seconds": POLL}))
    for s in servers:
        body = readyz(s)
        assert body["bundle_sha256"] == manifest_sha256(bundles["b"])
        assert body["rollout"]["state"] == "in_sync"
        r = httpx.post(f"{s.url}/v1/search", json={"queries": [{"vector": [1.0] * 32}], "k": 2}, timeout=10)
        assert r.status_code == 200 and r.json()["bundle_version"] == version["b"]

    name_bundle(registry, bundles["corrupt"])  # the right digest, a corrupt embeddings file
    wait_all(servers, lambda r: r["rollout"]["state"] == "refused", "corrupt bundle refused")
    for s in servers:
        body = readyz(s)
        assert body["bundle_version"] == version["b"] and "embeddings.npy" in body["rollout"]["reason"]
        assert metric(s, "esp_bundle_in_sync") == 0.0
        assert metric(s, "esp_bundle_rollout_refusals_total") == 1.0
        r = httpx.post(f"{s.url}/v1/search", json={"queries": [{"vector": [1.0] * 32}], "k": 2}, timeout=10)
        assert r.status_code == 200 and r.json()["bundle_version"] == version["b"]
    time.sleep(4 * POLL)  # refused once, not once per poll
    assert all(metric(s, "esp_bundle_rollout_refusals_total") == 1.0 for s in servers)

    name_bundle(registry, bundles["a"], sha256="0" * 64)  # a digest that is not the bundle's
    wait_all(servers, lambda r: r["rollout"]["state"] == "refused" and "sha256" in r["rollout"]["reason"]
             and r["rollout"]["sha256"] == "0" * 64, "wrong digest refused")
    assert {readyz(s)["bundle_version"] for s in servers} == {version["b"]}

    name_bundle(registry, bundles["a"])
    wait_all(servers, lambda r: r["bundle_version"] == version["a"] and r["rollout"]["state"] == "in_sync",
             "back on bundle a")
    assert all(metric(s, "esp_bundle_in_sync") == 1.0 for s in servers)
