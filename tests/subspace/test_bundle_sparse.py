"""A bundle's sparse blocks (``sparse/<name>/``): written, hashed, listed, read back and verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from esp_retrieval.subspace.bundle import (
    MANIFEST,
    BundleError,
    content_version,
    read_bundle,
    sha256_file,
    write_bundle,
)
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.subspace.sparse import SparseLexical

LAYOUT = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
N = 40


def block(n: int = N, vocab: int = 30, seed: int = 0) -> SparseLexical:
    docs = sp.random(n, vocab, density=0.2, format="csr", dtype=np.float32, random_state=seed)
    idf = np.linspace(0.5, 3.0, vocab).astype(np.float32)
    return SparseLexical(docs, tuple(f"term{i}" for i in range(vocab)), idf, {"k1": 0.9, "b": 0.4})


def write(path: Path, **kw: Any) -> Path:
    x = np.random.default_rng(1).standard_normal((N, LAYOUT.dim)).astype(np.float32)
    return write_bundle(path, LAYOUT, normalize_blocks(x, LAYOUT), [f"d{i}" for i in range(N)], **kw)


def rehash(path: Path, edit: Any = None) -> None:
    """Re-list every file's checksum (and the version) after a deliberate change, so that only
    the check under test can object; ``edit(manifest)`` changes the manifest first."""
    manifest = json.loads((path / MANIFEST).read_text())
    if edit is not None:
        edit(manifest)
    manifest["files"] = {rel: sha256_file(path / rel) for rel in manifest["files"]}
    manifest["version"] = content_version(manifest["files"])
    (path / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("snapshot", [False, True])
def test_round_trip(tmp_path: Path, snapshot: bool) -> None:
    bm25, other = block(), block(vocab=12, seed=2)
    path = write(tmp_path / "b", sparse={"bm25": bm25, "titles": other}, sparse_weights={"bm25": 0.3})
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["sparse"] == [
        {"name": "bm25", "kind": "bm25", "vocab_size": 30, "default_weight": 0.3},
        {"name": "titles", "kind": "bm25", "vocab_size": 12, "default_weight": 1.0},
    ]
    for f in ("data.npy", "indices.npy", "indptr.npy", "vocab.json"):
        assert f"sparse/bm25/{f}" in manifest["files"]
    back = read_bundle(path, snapshot=snapshot)
    assert list(back.sparse) == ["bm25", "titles"]
    got = back.sparse["bm25"]
    assert (got.docs != bm25.docs).nnz == 0 and got.docs.dtype == np.float32
    assert got.vocab == bm25.vocab and dict(got.params) == {"k1": 0.9, "b": 0.4}
    np.testing.assert_array_equal(got.idf, bm25.idf)


def test_cli_bundle_info_lists_the_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from esp_retrieval.cli.main import main as esp

    assert esp(["bundle-info", str(write(tmp_path / "b", sparse={"bm25": block()}))]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sparse"] == [{"name": "bm25", "kind": "bm25", "vocab_size": 30, "default_weight": 1.0}]
    assert esp(["bundle-info", str(write(tmp_path / "plain"))]) == 0
    assert "sparse" not in json.loads(capsys.readouterr().out)


def test_a_bundle_without_sparse_blocks_is_as_before(tmp_path: Path) -> None:
    path = write(tmp_path / "b")
    manifest = json.loads((path / MANIFEST).read_text())
    assert "sparse" not in manifest and not any(r.startswith("sparse/") for r in manifest["files"])
    assert read_bundle(path).sparse == {}


def test_the_engine_serves_the_bundles_blocks(tmp_path: Path) -> None:
    bm25 = block()
    bundle = read_bundle(write(tmp_path / "b", sparse={"bm25": bm25}))
    engine = NumpyBackend(np.asarray(bundle.embeddings), bundle.layout, sparse_blocks=bundle.sparse)
    q = sp.random(2, 30, density=0.3, format="csr", random_state=3)
    res = engine.search(np.asarray(bundle.embeddings[:2]), np.zeros(2), 3, sparse={"bm25": (q, 1.0)})
    np.testing.assert_array_equal(res.rows, np.argsort(-bm25.scores(q), axis=1, kind="stable")[:, :3])
    engine.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sparse": {"semantic": block()}}, "sparse.semantic: the layout has a block of that name"),
        ({"sparse": {"a/b": block()}}, "sparse.a/b: a sparse block's name"),
        ({"sparse": {"bm25": block(n=N - 1)}}, "sparse.bm25: 39 documents for 40 embedding rows"),
        ({"sparse": {"bm25": "x"}}, "sparse.bm25: must be a SparseLexical"),
        ({"sparse": {"bm25": block()}, "sparse_weights": {"bm25": -1.0}}, "sparse_weights.bm25: must be"),
        ({"sparse": {"bm25": block()}, "sparse_weights": {"other": 1.0}}, "sparse_weights: ['other']"),
        ({"sections": {"sparse": []}}, "reserved manifest keys ['sparse']"),
    ],
)
def test_write_refuses_bad_blocks(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BundleError, match=None) as info:
        write(tmp_path / "b", **kwargs)
    assert message in str(info.value)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_flipped_byte_is_refused_naming_the_file(tmp_path: Path, snapshot: bool) -> None:
    path = write(tmp_path / "b", sparse={"bm25": block()})
    target = path / "sparse" / "bm25" / "data.npy"
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0xFF
    target.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match=r"sparse/bm25/data\.npy: sha256 mismatch"):
        read_bundle(path, snapshot=snapshot)


def test_missing_and_unlisted_files_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "b", sparse={"bm25": block()})
    (path / "sparse" / "bm25" / "extra.npy").write_bytes(b"x")
    with pytest.raises(BundleError, match=r"sparse/bm25/extra\.npy: present .* not listed"):
        read_bundle(path)
    (path / "sparse" / "bm25" / "extra.npy").unlink()
    (path / "sparse" / "bm25" / "indptr.npy").unlink()
    with pytest.raises(BundleError, match=r"sparse/bm25/indptr\.npy: listed in the manifest but missing"):
        read_bundle(path)


def test_manifest_and_content_disagreements_are_named(tmp_path: Path) -> None:
    path = write(tmp_path / "b", sparse={"bm25": block()})
    original = (path / MANIFEST).read_text()

    def refused(edit: Any, message: str) -> None:
        rehash(path, edit)
        with pytest.raises(BundleError) as info:
            read_bundle(path)
        assert message in str(info.value), str(info.value)
        (path / MANIFEST).write_text(original)

    refused(lambda m: m["sparse"][0].update(vocab_size=31), "sparse/bm25/vocab.json: 30 terms but")
    refused(lambda m: m["sparse"][0].update(kind="splade"), "manifest.json:sparse[0].kind: 'splade'")
    refused(lambda m: m["sparse"][0].update(default_weight=-1), "manifest.json:sparse[0].default_weight")
    refused(lambda m: m.update(sparse=[]), "sparse/bm25/data.npy: under sparse/ but not a sparse block")
    refused(lambda m: m.update(sparse={"bm25": 1}), "manifest.json: 'sparse' must be a list of objects")
    refused(lambda m: m["files"].pop("sparse/bm25/vocab.json"), "sparse/bm25/vocab.json")

    meta = json.loads((path / "sparse" / "bm25" / "vocab.json").read_text())
    meta["n_docs"] = N - 1  # the matrix no longer has one row per corpus row
    (path / "sparse" / "bm25" / "vocab.json").write_text(json.dumps(meta))
    rehash(path)
    with pytest.raises(BundleError, match=r"^sparse/bm25/"):
        read_bundle(path)


def test_a_block_of_another_corpus_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "b", sparse={"bm25": block()})
    block(n=N - 1).save(path / "sparse" / "bm25")  # a whole, consistent block of 39 documents
    rehash(path)
    with pytest.raises(BundleError, match=r"sparse/bm25/vocab\.json: 39 documents but corpus\.count is 40"):
        read_bundle(path)
