"""``esp milvus-load``: writes a bundle into a collection, resumes, refuses another corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.cli.main import main
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

pytest.importorskip("milvus_lite")


def _bundle(path: Path, seed: int, n: int = 250) -> Path:
    layout = SubspaceLayout.from_dims({"a": 8, "b": 4})
    emb = normalize_blocks(np.random.default_rng(seed).standard_normal((n, 12)).astype(np.float32), layout)
    docs = [{"text": f"t{i}", "lang": "en" if i % 2 else "de", "year": 2000 + i % 7} for i in range(n)]
    return write_bundle(path, layout, emb, [f"d{i}" for i in range(n)], docs=docs)


def test_load_resume_and_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "m.db")
    first = _bundle(tmp_path / "b1", seed=1)
    args = ["milvus-load", str(first), "--uri", db, "--collection", "c", "--batch", "100", "--no-progress"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 250 and report["resumed_at"] == 0 and report["index"] == "FLAT"
    assert report["metadata_fields"] == {"text": "text", "lang": "string", "year": "int"}  # text: not filterable
    assert main(args) == 0  # everything is there: nothing to write
    assert json.loads(capsys.readouterr().out)["resumed_at"] == 250
    other = _bundle(tmp_path / "b2", seed=2)
    refused = ["milvus-load", str(other), "--uri", db, "--collection", "c", "--no-progress"]
    assert main(refused) == 2
    assert "another corpus" in capsys.readouterr().err
    assert main([*refused, "--replace", "--index", "ivf_flat", "--nlist", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["index"] == "IVF_FLAT"


def _stored(uri: str, collection: str) -> dict[str, dict[str, object]]:
    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri, alias="esp-test-read")
    try:
        got = client.query(collection, filter="esp_row >= 0", output_fields=["*"], limit=16384)
    finally:
        client.close()
    return {str(r["esp_id"]): r for r in got}


def test_an_interrupted_load_resumes_at_the_first_missing_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pymilvus import MilvusClient

    from esp_retrieval.service.engine.milvus_backend import MilvusSettings, load_bundle
    from esp_retrieval.subspace.bundle import read_bundle
    from esp_retrieval.subspace.filters import MetadataSchema

    path = _bundle(tmp_path / "b", seed=3)
    b = read_bundle(path)
    settings = MilvusSettings(uri=str(tmp_path / "m.db"), collection="c")
    assert settings.uri is not None

    def stop_after_one_batch(done: int, total: int) -> None:
        if done >= 100:
            raise RuntimeError("interrupted")

    schema = MetadataSchema.of_bundle(b.manifest, b.docs())
    with pytest.raises(RuntimeError, match="interrupted"):
        load_bundle(
            settings,
            b.layout,
            b.embeddings,
            b.ids,
            b.docs(),
            schema=schema,
            bundle_version=b.version,
            batch=100,
            progress=stop_after_one_batch,
        )
    args = [
        "milvus-load",
        str(path),
        "--uri",
        settings.uri,
        "--collection",
        "c",
        "--batch",
        "100",
        "--no-progress",
    ]
    assert main(args) == 0  # the request in flight at the interruption landed: rows 0..199
    report = json.loads(capsys.readouterr().out)
    assert report["resumed_at"] == 200 and report["rows"] == 250

    # a hole (requests complete out of order): rows past it are deleted and written once again
    client = MilvusClient(uri=settings.uri, alias="esp-test-hole")
    try:
        client.delete("c", filter="esp_row >= 120 and esp_row < 130")
    finally:
        client.close()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["resumed_at"] == 120
    stored = _stored(settings.uri, "c")
    assert len(stored) == 250  # no row twice, none missing
    docs = b.docs()
    assert docs is not None
    for i, doc_id in enumerate(b.ids):  # ids, rows, vectors (bit for bit) and fields as the bundle has them
        r = stored[doc_id]
        assert r["esp_row"] == i
        assert np.array_equal(np.asarray(r["esp_vector"], np.float32), b.embeddings[i])
        assert (r["text"], r["lang"], r["year"]) == (docs[i]["text"], docs[i]["lang"], docs[i]["year"])
        assert r["esp_has_text"] and r["esp_has_year"]


def test_a_collection_written_when_text_was_a_string_is_resumed_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esp_retrieval.service.engine.milvus_backend import MilvusSettings, load_bundle
    from esp_retrieval.subspace.bundle import read_bundle
    from esp_retrieval.subspace.filters import MetadataSchema

    db = str(tmp_path / "m.db")
    bundle = read_bundle(_bundle(tmp_path / "b", seed=3))
    old = MetadataSchema.from_dict({"text": "string", "lang": "string", "year": "int"})  # as before
    settings = MilvusSettings(uri=db, collection="c")
    load_bundle(settings, bundle.layout, bundle.embeddings, bundle.ids, bundle.docs(), schema=old)
    args = ["milvus-load", str(bundle.path), "--uri", db, "--collection", "c", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err  # the same VARCHAR column: not another corpus
    assert json.loads(capsys.readouterr().out)["resumed_at"] == 250  # nothing to write again
