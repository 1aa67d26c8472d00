"""Bundle round trip, atomic writes, and refusal of corrupt bundles with a message naming the problem."""

import json
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.cli.main import main as esp
from esp_retrieval.subspace.bundle import (
    EMBEDDINGS,
    IDS,
    MANIFEST,
    BundleError,
    read_bundle,
    sha256_file,
    write_bundle,
)
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 6, "entity": 3, "intent": 3})


def _emb(n: int = 20, dtype: type = np.float32) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, LAYOUT.dim)).astype(np.float32)
    return normalize_blocks(x, LAYOUT).astype(dtype)


def _write(path: Path, n: int = 20, **kw: object) -> Path:
    ids = [f"doc-{i}" for i in range(n)]
    docs = [{"text": f"passage {i}", "title": f"t{i}"} for i in range(n)]
    return write_bundle(path, LAYOUT, _emb(n), ids, docs=docs, **kw)  # type: ignore[arg-type]


def _rewrite_checksums(path: Path) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"] = {rel: sha256_file(path / rel) for rel in manifest["files"]}
    (path / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_trip(tmp_path: Path, dtype: type) -> None:
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "config.json").write_text('{"pooling": "mean"}')
    out = write_bundle(
        tmp_path / "b",
        LAYOUT,
        _emb(dtype=dtype),
        [f"d{i}" for i in range(20)],
        docs=[{"text": str(i)} for i in range(20)],
        encoder_dir=enc,
        sections={"training": {"seed": 1}, "operating_points": {"balanced": {"weights": {"semantic": 1}}}},
    )
    b = read_bundle(out)
    assert b.layout == LAYOUT
    assert b.embeddings.dtype == dtype and b.embeddings.shape == (20, 12)
    np.testing.assert_array_equal(b.embeddings, _emb(dtype=dtype))
    assert b.ids[3] == "d3" and b.docs()[5] == {"text": "5"}  # type: ignore[index]
    assert b.manifest["training"] == {"seed": 1}
    assert b.operating_points == {"balanced": {"weights": {"semantic": 1}}}
    assert b.encoder_dir is not None and (b.encoder_dir / "config.json").exists()
    assert "encoder/config.json" in b.manifest["files"]
    assert len(b.version) == 12
    assert read_bundle(_write(tmp_path / "c")).version != b.version


def test_same_content_same_version_and_overwrite_is_atomic(tmp_path: Path) -> None:
    v1 = read_bundle(_write(tmp_path / "a")).version
    assert read_bundle(_write(tmp_path / "b")).version == v1
    with pytest.raises(BundleError, match="already exists"):
        _write(tmp_path / "a")
    _write(tmp_path / "a", n=10, overwrite=True)
    assert read_bundle(tmp_path / "a").embeddings.shape[0] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temp dirs left behind


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="docs: 3 rows for 20 embedding rows"):
        write_bundle(tmp_path / "x", LAYOUT, _emb(), [f"d{i}" for i in range(20)], docs=[{}] * 3)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embeddings": np.zeros((3, 5), np.float32)}, r"embeddings: shape \(3, 5\) does not match layout dim 12"),
        ({"embeddings": np.zeros((20, 12), np.int8)}, "dtype int8 not supported"),
        ({"ids": ["a"] * 20}, "duplicate id 'a'"),
        ({"ids": ["a"]}, "1 ids for 20 embedding rows"),
        ({"ids": [str(i) for i in range(19)] + [""]}, "id at row 19 must be a non-empty string"),
    ],
)
def test_write_rejects_bad_inputs(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"embeddings": _emb(), "ids": [f"d{i}" for i in range(20)], **kwargs}
    with pytest.raises(BundleError, match=message):
        write_bundle(tmp_path / "x", LAYOUT, args["embeddings"], args["ids"])


def test_flipped_byte_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    raw = bytearray((path / EMBEDDINGS).read_bytes())
    raw[-7] ^= 0x01
    (path / EMBEDDINGS).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match=r"embeddings\.npy: sha256 mismatch"):
        read_bundle(path)


def test_truncated_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    raw = (path / EMBEDDINGS).read_bytes()
    (path / EMBEDDINGS).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BundleError, match=r"embeddings\.npy: sha256 mismatch"):
        read_bundle(path)
    _rewrite_checksums(path)  # even with matching checksums, the file itself is unreadable
    with pytest.raises(BundleError, match=r"embeddings\.npy: unreadable"):
        read_bundle(path)


def test_wrong_shape_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    np.save(path / EMBEDDINGS, np.zeros((20, 11), np.float32))
    _rewrite_checksums(path)
    with pytest.raises(BundleError, match=r"embeddings\.npy: shape \(20, 11\) does not match layout dim 12"):
        read_bundle(path)
    np.save(path / EMBEDDINGS, np.zeros((21, 12), np.float32))
    _rewrite_checksums(path)
    with pytest.raises(BundleError, match=r"embeddings\.npy: 21 rows but manifest corpus\.count is 20"):
        read_bundle(path)
    np.save(path / EMBEDDINGS, np.zeros((20, 12), np.float16))
    _rewrite_checksums(path)
    with pytest.raises(BundleError, match=r"embeddings\.npy: dtype float16 but manifest corpus\.dtype"):
        read_bundle(path)


def test_manifest_problems_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    manifest = json.loads((path / MANIFEST).read_text())
    bad_layout = {**manifest, "layout": {"objectives": [{"name": "a", "dim": 0, "offset": 0}]}}
    (path / MANIFEST).write_text(json.dumps(bad_layout))
    with pytest.raises(BundleError, match="manifest.json: layout is invalid: .*dim must be positive"):
        read_bundle(path)
    (path / MANIFEST).write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(BundleError, match="format_version 99 is not supported"):
        read_bundle(path)
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match="manifest.json: not valid JSON"):
        read_bundle(path)
    (path / MANIFEST).unlink()
    with pytest.raises(BundleError, match="manifest.json: missing"):
        read_bundle(path)


def test_missing_and_unlisted_files_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    (path / "stray.bin").write_bytes(b"x")
    with pytest.raises(BundleError, match="stray.bin: present .* but not listed"):
        read_bundle(path)
    (path / "stray.bin").unlink()
    (path / IDS).unlink()
    with pytest.raises(BundleError, match="ids.json: listed in the manifest but missing"):
        read_bundle(path)


def test_ids_are_checked(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    (path / IDS).write_text(json.dumps(["same"] * 20))
    _rewrite_checksums(path)
    with pytest.raises(BundleError, match="ids.json: duplicate id 'same'"):
        read_bundle(path)


def test_no_pickle_on_load(tmp_path: Path) -> None:
    path = _write(tmp_path / "b")
    np.save(path / EMBEDDINGS, np.array([{"evil": 1}] * 20, dtype=object), allow_pickle=True)
    _rewrite_checksums(path)
    with pytest.raises(BundleError, match=r"embeddings\.npy: unreadable"):
        read_bundle(path)


def test_cli_bundle_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "b")
    assert esp(["bundle-info", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["corpus"] == {"count": 20, "dim": 12, "dtype": "float32"}
    assert [o["name"] for o in summary["layout"]] == ["semantic", "entity", "intent"]
    (path / IDS).write_text("[]")
    assert esp(["bundle-info", str(path)]) == 1
    assert "ids.json: sha256 mismatch" in capsys.readouterr().err
