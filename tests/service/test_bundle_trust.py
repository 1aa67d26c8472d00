"""The service serves only bundles that cannot change under it: private snapshot, permissions,
and an encoder-less bundle does not silently replace one with an encoder."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from service.config import Settings
from service.lifecycle import check_encoder_kept
from service.state import load_state
from subspace.bundle import EMBEDDINGS, BundleError, write_bundle
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

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
    with caplog.at_level(logging.WARNING, logger="service.state"):
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
