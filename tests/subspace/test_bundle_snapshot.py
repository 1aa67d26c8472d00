"""What is read cannot change under the reader: a snapshot is private and hashed as read, the
version is the checksums', and writable-by-others paths are named."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.subspace.bundle import (
    EMBEDDINGS,
    MANIFEST,
    BundleError,
    content_version,
    read_bundle,
    unreadable,
    writable_by_others,
    write_bundle,
)
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})


def _write(path: Path, seed: int = 0, n: int = 30) -> Path:
    x = np.random.default_rng(seed).standard_normal((n, LAYOUT.dim)).astype(np.float32)
    docs = [{"text": f"passage {i}"} for i in range(n)]
    return write_bundle(path, LAYOUT, normalize_blocks(x, LAYOUT), [f"d{i}" for i in range(n)], docs=docs)


def test_a_snapshot_does_not_change_when_the_files_do(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    snap = read_bundle(path, snapshot=True)
    before = np.array(snap.embeddings)
    assert snap.docs() == [{"text": f"passage {i}"} for i in range(30)]
    raw = bytearray((path / EMBEDDINGS).read_bytes())
    raw[-64:] = bytes(64)  # edited in place ...
    (path / EMBEDDINGS).write_bytes(bytes(raw))
    (path / "docs.jsonl").write_text("")
    np.testing.assert_array_equal(snap.embeddings, before)
    assert snap.docs()[0] == {"text": "passage 0"}  # type: ignore[index]
    os.truncate(path / EMBEDDINGS, 10)  # ... and truncated: a shared mapping would fault (SIGBUS)
    np.testing.assert_array_equal(snap.embeddings, before)
    assert not isinstance(snap.embeddings, np.memmap) and not snap.embeddings.flags.writeable


def test_a_snapshot_checks_the_bytes_it_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    raw = bytearray((path / EMBEDDINGS).read_bytes())
    raw[-4:] = b"\x00\x00\x80\x7f"
    (path / EMBEDDINGS).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match=r"embeddings\.npy: sha256 mismatch"):
        read_bundle(path, snapshot=True)


def test_the_version_must_be_the_one_the_checksums_give(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["version"] == content_version(manifest["files"])
    other = _write(tmp_path / "other", seed=1)
    reused = {**json.loads((other / MANIFEST).read_text()), "version": manifest["version"]}
    (other / MANIFEST).write_text(json.dumps(reused))  # a different bundle reusing the version
    with pytest.raises(BundleError, match="manifest.json: version .* is not the version of its files' checksums"):
        read_bundle(other)
    with pytest.raises(BundleError, match="not the version of its files' checksums"):
        read_bundle(other, snapshot=True)


def test_paths_others_may_write_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    assert writable_by_others(path) == []
    os.chmod(path / EMBEDDINGS, 0o666)
    os.chmod(path, 0o775)
    assert writable_by_others(path) == [".", EMBEDDINGS]


def test_a_bundle_is_readable_by_every_uid_whatever_wrote_its_files(tmp_path: Path) -> None:
    """A private encoder file (safetensors writes 0o600) and a private umask still give a bundle
    that another uid can serve and nobody else can change."""
    enc = tmp_path / "enc"
    (enc / "transformer").mkdir(parents=True)
    (enc / "heads.safetensors").write_bytes(b"weights")
    (enc / "transformer" / "model.safetensors").write_bytes(b"trunk")
    for p in (enc / "heads.safetensors", enc / "transformer" / "model.safetensors", enc / "transformer"):
        os.chmod(p, 0o700 if p.is_dir() else 0o600)
    old = os.umask(0o077)
    try:
        x = normalize_blocks(np.random.default_rng(0).standard_normal((5, LAYOUT.dim)).astype(np.float32), LAYOUT)
        path = write_bundle(tmp_path / "b", LAYOUT, x, [f"d{i}" for i in range(5)],
                            docs=[{"text": "t"}] * 5, encoder_dir=enc)
    finally:
        os.umask(old)
    modes = {p.relative_to(path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [path, *path.rglob("*")]}
    assert {m for p, m in modes.items() if (path / p).is_dir()} == {0o755}
    assert {m for p, m in modes.items() if (path / p).is_file()} == {0o644}
    assert "encoder/transformer/model.safetensors" in modes
    assert writable_by_others(path) == [] and unreadable(path) == []
