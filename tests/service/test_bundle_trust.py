"""The service serves only bundles that cannot change under it: private snapshot (the index and
the query encoder's weights), permissions, and an encoder-less bundle does not silently replace
one with an encoder."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.service.config import Settings
from esp_retrieval.service.lifecycle import check_encoder_kept
from esp_retrieval.service.state import load_state
from esp_retrieval.subspace.bundle import EMBEDDINGS, BundleError, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from tests.encoder.test_private_weights import CHANGES, tamper

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})


def _bundle(path: Path) -> Path:
    x = np.random.default_rng(0).standard_normal((50, LAYOUT.dim)).astype(np.float32)
    return write_bundle(path, LAYOUT, normalize_blocks(x, LAYOUT), [f"d{i}" for i in range(50)])


def _settings(**kw: object) -> Settings:
    return Settings(backend="numpy", threads=1, **kw)  # type: ignore[arg-type]


def test_the_served_index_is_a_private_copy_not_a_mapping(tmp_path: Path) -> None:
    state = load_state(_bundle(tmp_path / "b"), _settings())
    assert not isinstance(state.bundle.embeddings, np.memmap)
    before = state.search(np.asarray(state.bundle.embeddings[:2]), np.ones(2), 5)
    os.truncate(tmp_path / "b" / EMBEDDINGS, 0)  # the file goes away under the server
    after = state.search(np.asarray(state.bundle.embeddings[:2]), np.ones(2), 5)
    np.testing.assert_array_equal(before.rows, after.rows)
    state.retire()


def test_a_bundle_others_may_write_is_refused_or_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _bundle(tmp_path / "b")
    os.chmod(path / EMBEDDINGS, 0o666)
    with pytest.raises(BundleError, match="'embeddings.npy': writable by group or others"):
        load_state(path, _settings())
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.state"):
        state = load_state(path, _settings(bundle_permissions="warn"))
    assert "writable by group or others" in caplog.text
    state.retire()


def test_an_encoder_less_bundle_does_not_replace_one_with_an_encoder(tmp_path: Path) -> None:
    path = _bundle(tmp_path / "b")
    with_encoder = SimpleNamespace(encoder=object(), version="abc")
    with pytest.raises(BundleError, match="encoder/: the bundle has no query encoder but the served bundle abc"):
        check_encoder_kept(path, with_encoder, _settings())  # type: ignore[arg-type]
    check_encoder_kept(path, with_encoder, _settings(allow_no_encoder=True))  # type: ignore[arg-type]
    check_encoder_kept(path, SimpleNamespace(encoder=None, version="v"), _settings())  # type: ignore[arg-type]
    check_encoder_kept(path, None, _settings())  # the first bundle: vectors-only serving is allowed
    shutil.rmtree(path)


def test_a_live_server_keeps_its_encoder_when_the_files_are_edited_or_truncated(
    tiny_bundle_factory: Callable[[str], Path], server_factory: Callable[..., LiveServer]
) -> None:
    """Every file of ``encoder/`` edited in place, then truncated, while the server serves text
    queries: the process lives and answers exactly as before (a weight mapped from a file would
    change the ranking on the edit, and kill the server with SIGBUS on the truncation)."""
    bundle = tiny_bundle_factory("served")
    server = server_factory(bundle)
    texts = ["how to bake bread", "facebook login page", "symptoms of flu in adults"]

    def answers() -> tuple[list[list[tuple[str, float]]], list[list[float]]]:
        hits = httpx.post(f"{server.url}/v1/search", json={"queries": [{"text": t} for t in texts], "k": 20},
                          timeout=30)
        vectors = httpx.post(f"{server.url}/v1/embeddings", json={"input": texts}, timeout=30)
        assert hits.status_code == vectors.status_code == 200, (hits.text, vectors.text)
        ranking = [[(h["id"], h["score"]) for h in r["hits"]] for r in hits.json()["results"]]
        return ranking, [d["embedding"] for d in vectors.json()["data"]]

    before = answers()
    files = sorted(p for p in (bundle / "encoder").rglob("*") if p.is_file())
    assert any(p.name == "model.safetensors" for p in files)
    for change in CHANGES:
        for path in files:
            tamper(path, change)
            assert server.proc.poll() is None, f"the server died after {change} of {path.name}:\n{server.log(3000)}"
            assert answers() == before, f"{change} of {path.relative_to(bundle)} changed the answers"
    assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
