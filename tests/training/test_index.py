"""`esp index`: same vectors as the training export; bad corpus files stop naming the line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.cli.main import main
from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.training.data.corpus import CorpusError, read_corpus
from esp_retrieval.training.display_text import repair_text


def _index(bundle: Path, corpus: Path, out: Path, *extra: str) -> int:
    """``esp index`` through the real CLI entry point, without a progress bar."""
    return main(["index", "--bundle", str(bundle), "--corpus", str(corpus), "--out", str(out),
                 "--no-progress", *extra])


def test_index_tsv_reproduces_export_vectors(tiny_bundle: Path, tiny_corpus, tmp_path: Path, capsys) -> None:
    ids, texts = tiny_corpus
    corpus = tmp_path / "docs.tsv"
    corpus.write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in zip(ids, texts, strict=True)), "utf-8")
    out = tmp_path / "indexed"
    assert _index(tiny_bundle, corpus, out, "--batch-size", "7") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 60 and summary["skipped_empty"] == 0
    src, new = read_bundle(tiny_bundle), read_bundle(out)
    assert new.ids == src.ids and new.layout == src.layout
    np.testing.assert_allclose(np.asarray(new.embeddings), np.asarray(src.embeddings), atol=1e-5)
    assert new.operating_points == src.operating_points
    assert [d["text"] for d in new.docs()] == [repair_text(t) for t in texts]  # display repaired (ftfy)


def test_index_jsonl_gz_keeps_display_fields_skips_empty_counts_truncated(
    tiny_bundle: Path, tmp_path: Path
) -> None:
    from esp_retrieval.training.indexing import index_corpus

    rows = [
        {"id": 1, "text": "cost of interior concrete flooring", "title": "Floors", "url": "http://x"},
        {"id": "b", "text": "   "},
        {"id": "c", "text": " ".join(["the"] * 500)},
    ]
    corpus = tmp_path / "docs.jsonl.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    summary = index_corpus(tiny_bundle, corpus, tmp_path / "b", progress=False, dtype="float16")
    assert (summary["documents"], summary["skipped_empty"], summary["truncated"]) == (2, 1, 1)
    b = read_bundle(tmp_path / "b")
    assert b.ids == ["1", "c"] and b.embeddings.dtype == np.float16
    assert b.docs()[0] == {"text": rows[0]["text"], "title": "Floors", "url": "http://x"}
    assert b.manifest["index"]["skipped_empty"] == 1


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("dup.tsv", b"a\tone\nb\ttwo\na\tthree\n", "dup.tsv:3: duplicate id 'a' (first on line 1)"),
        ("cols.tsv", b"a\tone\nb two\n", "cols.tsv:2: expected 2 tab-separated columns"),
        ("utf.tsv", b"a\tone\nb\tt\xffwo\n", "utf.tsv:2: invalid UTF-8"),
        ("miss.jsonl", b'{"id": "a", "text": "x"}\n{"id": "b"}\n', "miss.jsonl:2: missing field 'text'"),
        ("bad.jsonl", b'{"id": "a", "text": "x"}\n{oops\n', "bad.jsonl:2: invalid JSON"),
        ("noid.tsv", b"\tone\n", "noid.tsv:1: empty id"),
    ],
)
def test_bad_corpus_names_the_line(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorpusError) as err:
        list(read_corpus(path))
    assert message in str(err.value)


def test_cli_reports_bad_corpus(tiny_bundle: Path, tmp_path: Path, capsys) -> None:
    path = tmp_path / "dup.tsv"
    path.write_text("a\tone\na\ttwo\n", "utf-8")
    assert _index(tiny_bundle, path, tmp_path / "o") == 1
    assert "dup.tsv:2: duplicate id 'a'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(CorpusError, match="unknown corpus format"):
        list(read_corpus(tmp_path / "x.csv"))
