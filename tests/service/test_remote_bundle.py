"""Bundles from object storage (esp_retrieval/service/remote_bundle.py): fetched by fsspec URI into a cache,
the manifest's digest checked before anything else is fetched, every file checked as it arrives;
fsspec's memory and local filesystems and a loopback HTTP server stand in for a bucket."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest

from esp_retrieval.cli.main import main
from esp_retrieval.service.config import Settings
from esp_retrieval.service.remote_bundle import (
    BundleFetchError,
    fetch_bundle,
    is_uri,
    prune_cache,
    remote_manifest_sha256,
)
from esp_retrieval.subspace.bundle import MANIFEST, read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})


def make_bundle(path: Path, seed: int = 0, n: int = 20) -> Path:
    x = np.random.default_rng(seed).standard_normal((n, LAYOUT.dim)).astype(np.float32)
    enc = path.parent / f"{path.name}-encoder"
    (enc / "transformer").mkdir(parents=True, exist_ok=True)
    (enc / "transformer" / "config.json").write_text("{}")  # a nested file, as encoder/ has
    return write_bundle(path, LAYOUT, normalize_blocks(x, LAYOUT), [f"d{i}" for i in range(n)],
                        docs=[{"text": f"passage {i}"} for i in range(n)], encoder_dir=enc)


def digest(bundle: Path) -> str:
    return hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest()


@pytest.fixture
def memory_bundle(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A bundle uploaded to fsspec's memory filesystem: (its URI, the local original)."""
    local = make_bundle(tmp_path / "src")
    fs = fsspec.filesystem("memory")
    root = f"/esp-test-{tmp_path.name}/bundle"
    for p in local.rglob("*"):
        if p.is_file():
            fs.pipe_file(f"{root}/{p.relative_to(local).as_posix()}", p.read_bytes())
    yield f"memory://{root}", local
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server over a folder (no directory listing needed): (its URL, the folder)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_a_memory_bundle_is_fetched_verified_and_published(memory_bundle: tuple[str, Path], tmp_path: Path) -> None:
    uri, local = memory_bundle
    sha = digest(local)
    assert remote_manifest_sha256(uri) == sha
    path = fetch_bundle(uri, sha, tmp_path / "cache")
    assert path == tmp_path / "cache" / sha
    got, want = read_bundle(path, verify_checksums=True), read_bundle(local)
    assert got.version == want.version and got.docs() == want.docs()
    np.testing.assert_array_equal(got.embeddings, want.embeddings)
    assert (path / "encoder" / "transformer" / "config.json").read_text() == "{}"
    assert {stat.S_IMODE(p.stat().st_mode) for p in path.rglob("*") if p.is_file()} == {0o644}
    assert fetch_bundle(uri, sha, tmp_path / "cache") == path  # cached: nothing fetched again


def test_a_wrong_digest_is_refused_before_anything_else_is_fetched(
    memory_bundle: tuple[str, Path], tmp_path: Path
) -> None:
    uri, local = memory_bundle
    wrong = "0" * 64
    with pytest.raises(BundleFetchError, match=f"manifest.json: sha256 is {digest(local)}, expected {wrong}"):
        fetch_bundle(uri, wrong, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    with pytest.raises(BundleFetchError, match="needs the sha256 of its manifest.json"):
        fetch_bundle(uri, None, tmp_path / "cache")
    with pytest.raises(BundleFetchError, match="not 64 lower-case hex digits"):
        fetch_bundle(uri, "ABC", tmp_path / "cache")


def test_a_file_that_differs_from_its_manifest_is_refused_and_nothing_is_published(
    memory_bundle: tuple[str, Path], tmp_path: Path
) -> None:
    uri, local = memory_bundle
    fs = fsspec.filesystem("memory")
    fs.pipe_file(uri.removeprefix("memory://") + "/ids.json", b'["tampered"]')
    with pytest.raises(BundleFetchError, match=r"ids\.json: sha256 mismatch"):
        fetch_bundle(uri, digest(local), tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # the temporary folder is gone too


def test_a_manifest_naming_paths_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    raw = json.dumps({"files": {"../../etc/evil": "0" * 64}}).encode()
    root = f"/esp-test-{tmp_path.name}/evil"
    fs.pipe_file(f"{root}/{MANIFEST}", raw)
    with pytest.raises(BundleFetchError, match="is not a path inside the bundle"):
        fetch_bundle(f"memory://{root}", hashlib.sha256(raw).hexdigest(), tmp_path / "cache")
    fs.rm(root, recursive=True)


def test_file_uris_and_a_loopback_http_server_serve_bundles(
    tmp_path: Path, http_root: tuple[str, Path]
) -> None:
    local = make_bundle(tmp_path / "local")
    path = fetch_bundle(local.as_uri(), digest(local), tmp_path / "cache")
    assert read_bundle(path, verify_checksums=True).version == read_bundle(local).version
    url, www = http_root
    make_bundle(www / "bundles" / "b", seed=1)
    remote = f"{url}/bundles/b"
    got = fetch_bundle(remote, digest(www / "bundles" / "b"), tmp_path / "cache")
    assert read_bundle(got, verify_checksums=True).version == read_bundle(www / "bundles" / "b").version
    with pytest.raises(BundleFetchError, match=r"bundles/missing/manifest\.json: cannot be read"):
        fetch_bundle(f"{url}/bundles/missing", "1" * 64, tmp_path / "cache")


def test_unknown_schemes_are_named(tmp_path: Path) -> None:
    with pytest.raises(BundleFetchError, match="nosuchscheme"):
        fetch_bundle("nosuchscheme://bucket/b", "1" * 64, tmp_path / "cache")


def test_prune_keeps_what_is_served(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for name in ("a" * 64, "b" * 64, "c" * 64, "not-a-digest"):
        (cache / name).mkdir(parents=True)
    assert prune_cache(cache, [cache / ("b" * 64)]) == ["a" * 64, "c" * 64]
    assert sorted(p.name for p in cache.iterdir()) == ["b" * 64, "not-a-digest"]


def test_esp_bundle_as_a_uri_is_the_bundle_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_uri("s3://models/esp") and is_uri("file:///m") and not is_uri("/models/bundle")
    monkeypatch.setenv("ESP_BUNDLE", "s3://models/esp/2026-01-07")
    settings = Settings()
    assert settings.bundle is None and settings.bundle_source == "s3://models/esp/2026-01-07"
    monkeypatch.setenv("ESP_BUNDLE", "/models/bundle")
    assert Settings().bundle_source == Path("/models/bundle")


def test_esp_fetch_bundle_prints_the_local_folder(
    memory_bundle: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri, local = memory_bundle
    assert main(["fetch-bundle", uri, "--sha256", digest(local), "--cache", str(tmp_path / "c")]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": str(tmp_path / "c" / digest(local)),
                                                   "sha256": digest(local)}
    assert main(["fetch-bundle", uri, "--sha256", "2" * 64, "--cache", str(tmp_path / "c")]) == 1
    assert "sha256 is" in capsys.readouterr().err


def test_a_live_server_serves_a_bundle_by_url_and_keeps_it_when_a_digest_is_wrong(
    served_bundle: Path, server_factory, http_root: tuple[str, Path], tmp_path: Path
) -> None:
    """``esp serve --bundle http://...`` with the digest, then the registry naming a bundle by URL:
    a wrong digest is refused (the served bundle kept), the right one is rolled out."""
    import httpx

    from esp_retrieval.subspace.atomic import atomic_write_text
    from tests.live_fixtures import REGISTRY_DOC, vectors_only

    url, www = http_root
    a = vectors_only(served_bundle, www / "a", seed=1)
    b = vectors_only(served_bundle, www / "b", seed=2)
    version = {"a": read_bundle(a).version, "b": read_bundle(b).version}
    registry, cache = tmp_path / "registry.json", tmp_path / "cache"

    def name(bundle: str, sha: str) -> None:
        atomic_write_text(registry, json.dumps({**REGISTRY_DOC, "bundle": {"path": f"{url}/{bundle}", "sha256": sha}}))

    def readyz() -> dict:
        return httpx.get(f"{server.url}/readyz", timeout=10).json()

    name("a", digest(a))
    server = server_factory(f"{url}/a", registry=registry, registry_poll_seconds=0.3, token="t0k3n",
                            bundle_sha256=digest(a), bundle_cache=cache)
    assert readyz()["bundle_version"] == version["a"]
    r = httpx.post(f"{server.url}/v1/search", json={"queries": [{"vector": [1.0] * 32}], "k": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["bundle_version"] == version["a"]

    name("b", "f" * 64)
    server.wait_until(lambda: readyz()["rollout"]["state"] == "refused", 60, "wrong digest refused")
    body = readyz()
    assert f"sha256 is {digest(b)}, the registry names {'f' * 64}" in body["rollout"]["reason"]
    assert body["bundle_version"] == version["a"]
    assert sorted(p.name for p in cache.iterdir()) == [digest(a)]  # b was never fetched

    name("b", digest(b))
    server.wait_until(lambda: readyz()["bundle_version"] == version["b"], 60, "serving bundle b")
    assert readyz()["rollout"]["state"] == "in_sync"
    assert sorted(p.name for p in cache.iterdir()) == sorted([digest(a), digest(b)])

    auth = {"Authorization": "Bearer t0k3n"}  # an admin reload by URL: the same check
    r = httpx.post(f"{server.url}/v1/admin/reload", json={"path": f"{url}/a", "sha256": "e" * 64},
                   headers=auth, timeout=60)
    assert r.status_code == 409 and f"sha256 is {digest(a)}, expected {'e' * 64}" in r.json()["message"]
    r = httpx.post(f"{server.url}/v1/admin/reload", json={"path": f"{url}/a"}, headers=auth, timeout=60)
    assert r.status_code == 409 and "needs the sha256" in r.json()["message"]
    assert readyz()["bundle_version"] == version["b"]
