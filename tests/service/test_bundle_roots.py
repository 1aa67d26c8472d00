"""ESP_BUNDLE_ROOTS: a bundle outside the allowed roots is refused at start-up, on reload and on
rollout (symlinks and ``..`` resolved first); unset, any bundle loads as before."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from esp_retrieval.service.app import create_app
from esp_retrieval.service.bundle_roots import BundleRootError, check_bundle_source, parse_roots
from esp_retrieval.service.config import Settings
from esp_retrieval.service.rollout import manifest_sha256
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
AUTH = {"Authorization": "Bearer t0ken"}


def _bundle(path: Path, seed: int) -> Path:
    emb = normalize_blocks(np.random.default_rng(seed).standard_normal((20, LAYOUT.dim)).astype(np.float32), LAYOUT)
    return write_bundle(path, LAYOUT, emb, [f"d{seed}-{i}" for i in range(20)])


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """An allowed root with two bundles, a bundle outside it, and two ways out of the root."""
    root = tmp_path / "models"
    outside = _bundle(tmp_path / "elsewhere" / "evil", seed=9)
    (root / "link").mkdir(parents=True)
    (root / "link" / "evil").symlink_to(outside, target_is_directory=True)
    return {
        "root": root,
        "a": _bundle(root / "a", seed=0),
        "b": _bundle(root / "b", seed=1),
        "outside": outside,
        "symlink": root / "link" / "evil",
        "dotdot": root / ".." / "elsewhere" / "evil",
    }


def _ready(c: TestClient) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while (r := c.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.02)
    body: dict[str, Any] = r.json()
    return body


@pytest.fixture
def client(tree: dict[str, Path]) -> Iterator[TestClient]:
    settings = Settings(bundle=tree["a"], backend="numpy", admin_token="t0ken", bundle_roots=str(tree["root"]))
    with TestClient(create_app(settings)) as c:
        _ready(c)
        yield c


# --- the one check --------------------------------------------------------------------------


def test_unset_roots_leave_every_source_as_it_is(tree: dict[str, Path]) -> None:
    assert parse_roots("") == parse_roots(" , ") == ()
    assert check_bundle_source(tree["dotdot"], (), "path") == tree["dotdot"]
    assert check_bundle_source("s3://anywhere/b", (), "path") == "s3://anywhere/b"


def test_a_path_inside_a_root_is_resolved_and_one_outside_is_refused(tree: dict[str, Path]) -> None:
    roots = parse_roots(f"{tree['root']}, s3://models/esp/")
    assert check_bundle_source(tree["root"] / "x" / ".." / "a", roots, "path") == tree["a"].resolve()
    for escape in ("outside", "symlink", "dotdot"):
        with pytest.raises(BundleRootError) as info:
            check_bundle_source(tree[escape], roots, "path")
        assert info.value.field == "path"
        assert "ESP_BUNDLE_ROOTS" in info.value.message and str(tree["root"]) in info.value.message


def test_uri_prefixes_match_at_a_slash_and_refuse_dot_segments() -> None:
    roots = parse_roots("/models,s3://models/esp")
    assert check_bundle_source("s3://models/esp/2026-01-07", roots, "path") == "s3://models/esp/2026-01-07"
    for uri in ("s3://models/esp-other/b", "s3://models/esp/../secret/b", "s3://models/esp/%2E%2E/b",
                "https://models/esp/b"):
        with pytest.raises(BundleRootError):
            check_bundle_source(uri, roots, "bundle.path")
    with pytest.raises(BundleRootError):  # a folder root admits no URI
        check_bundle_source("file:///models/b", roots, "path")


def test_a_relative_root_is_refused() -> None:
    with pytest.raises(ValidationError, match="ESP_BUNDLE_ROOTS"):
        Settings(bundle_roots="models")


# --- start-up ---------------------------------------------------------------------------------


@pytest.mark.parametrize("escape", ["outside", "symlink", "dotdot"])
def test_a_start_up_bundle_outside_the_roots_stops_the_server(tree: dict[str, Path], escape: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(bundle=tree[escape], bundle_roots=str(tree["root"]))
    assert "ESP_BUNDLE" in str(info.value) and "outside the allowed bundle roots" in str(info.value)
    with pytest.raises(ValidationError, match="outside the allowed bundle roots"):
        Settings(bundle="https://models.example/b", bundle_sha256="a" * 64, bundle_roots=str(tree["root"]))


# --- POST /v1/admin/reload --------------------------------------------------------------------


@pytest.mark.parametrize("escape", ["outside", "symlink", "dotdot"])
def test_a_reload_outside_the_roots_is_refused_and_the_served_bundle_kept(
    client: TestClient, tree: dict[str, Path], escape: str,
) -> None:
    version = client.get("/readyz").json()["bundle_version"]
    r = client.post("/v1/admin/reload", json={"path": str(tree[escape])}, headers=AUTH)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["type"] == "reload_failed" and body["field"] == "path"
    assert "ESP_BUNDLE_ROOTS" in body["message"] and str(tree["root"]) in body["message"]
    assert client.get("/readyz").json()["bundle_version"] == version
    remote = client.post("/v1/admin/reload", json={"path": "https://models.example/b", "sha256": "a" * 64},
                         headers=AUTH)
    assert remote.status_code == 409 and "outside the allowed bundle roots" in remote.json()["message"]
    assert client.post("/v1/search", json={"queries": [{"vector": [1.0] * 12}]}).status_code == 200


def test_a_reload_inside_the_roots_and_of_the_served_bundle_is_answered(
    client: TestClient, tree: dict[str, Path],
) -> None:
    r = client.post("/v1/admin/reload", json={"path": str(tree["b"])}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert client.post("/v1/admin/reload", headers=AUTH).status_code == 200  # the served one again


def test_unset_roots_let_a_reload_load_any_bundle(tree: dict[str, Path]) -> None:
    with TestClient(create_app(Settings(bundle=tree["a"], backend="numpy", admin_token="t0ken"))) as c:
        _ready(c)
        r = c.post("/v1/admin/reload", json={"path": str(tree["dotdot"])}, headers=AUTH)
        assert r.status_code == 200, r.text


# --- the registry's bundle (rollout) ----------------------------------------------------------


def test_a_rollout_outside_the_roots_is_refused_and_the_served_bundle_kept(tree: dict[str, Path]) -> None:
    registry = tree["root"].parent / "registry.json"
    registry.write_text(json.dumps({"bundle": {"path": str(tree["symlink"]),
                                               "sha256": manifest_sha256(tree["outside"])}}))
    settings = Settings(bundle=tree["a"], backend="numpy", registry=registry, registry_poll_seconds=0.05,
                        bundle_roots=str(tree["root"]))
    with TestClient(create_app(settings)) as c:
        version = _ready(c)["bundle_version"]
        deadline = time.monotonic() + 30
        while (rollout := c.get("/readyz").json()["rollout"])["state"] != "refused":
            assert time.monotonic() < deadline, rollout
            time.sleep(0.02)
        assert "bundle.path" in rollout["reason"] and "ESP_BUNDLE_ROOTS" in rollout["reason"]
        assert c.get("/readyz").json()["bundle_version"] == version
        # the file names a bundle inside the roots: it is rolled out
        registry.write_text(json.dumps({"bundle": {"path": str(tree["b"]), "sha256": manifest_sha256(tree["b"])}}))
        while (rollout := c.get("/readyz").json()["rollout"])["state"] != "in_sync":
            assert time.monotonic() < deadline, rollout
            time.sleep(0.02)
        assert c.get("/readyz").json()["bundle_version"] != version


def test_a_bundle_fetched_from_an_allowed_uri_reloads_from_its_cache(tree: dict[str, Path], tmp_path: Path) -> None:
    uri = tree["a"].as_uri()
    settings = Settings(bundle=uri, bundle_sha256=manifest_sha256(tree["a"]), bundle_cache=tmp_path / "cache",
                        backend="numpy", admin_token="t0ken", bundle_roots=f"{tree['root']},{tree['root'].as_uri()}/")
    with TestClient(create_app(settings)) as c:
        assert _ready(c)["bundle_version"]
        r = c.post("/v1/admin/reload", headers=AUTH)  # the served bundle, from the fetch cache
        assert r.status_code == 200, r.text
        assert Path(r.json()["path"]).parent == tmp_path / "cache"
        outside = c.post("/v1/admin/reload", json={"path": tree["outside"].as_uri(),
                                                   "sha256": manifest_sha256(tree["outside"])}, headers=AUTH)
        assert outside.status_code == 409 and "ESP_BUNDLE_ROOTS" in outside.json()["message"]
