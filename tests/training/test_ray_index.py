"""``esp index --engine ray`` on a local 2-CPU Ray cluster (one per module) against the single-process path.

Equal embeddings (1e-5), ids in the same order and the same display docs for TSV, JSONL.gz and
Parquet; a killed run resumes without re-encoding the shards it finished; bad lines stop the run
with the single-process reader's message.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.cli.main import main
from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.training.data.corpus import CorpusError, read_corpus

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster / torchrun processes per module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster (2 CPUs) for the module; ``index_corpus_ray`` reuses it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def rows(tiny_corpus) -> list[dict]:
    """240 documents (the 60 tiny-corpus passages, four times, unique ids), a title on some."""
    ids, texts = tiny_corpus
    out = []
    for r in range(4):
        for i, t in zip(ids, texts, strict=True):
            row = {"id": f"{i}-{r}", "text": t if r == 0 else f"{t} copy {r}"}
            if r == 1:
                row["title"] = f"title {i}"
            out.append(row)
    return out


def _write_tsv(path: Path, rows: list[dict]) -> Path:
    path.write_text("id\ttext\n" + "".join(f"{r['id']}\t{r['text']}\n" for r in rows), "utf-8")
    return path


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def _same_bundle(a: Path, b: Path) -> None:
    x, y = read_bundle(a), read_bundle(b)
    assert x.ids == y.ids
    assert np.abs(np.asarray(x.embeddings, np.float64) - np.asarray(y.embeddings, np.float64)).max() <= 1e-5
    assert x.docs() == y.docs()
    assert x.layout == y.layout and x.operating_points == y.operating_points


def test_ray_engine_equals_single_process_tsv_via_cli(cluster, tiny_bundle: Path, rows, tmp_path: Path,
                                                      capsys) -> None:
    corpus = tmp_path / "docs.tsv"
    _write_tsv(corpus, rows[:100])
    with corpus.open("a", encoding="utf-8") as fh:  # an empty text: skipped and counted by both
        fh.write("empty-1\t   \n")
    common = ["index", "--bundle", str(tiny_bundle), "--corpus", str(corpus), "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    single = json.loads(capsys.readouterr().out)
    assert main([*common, "--out", str(tmp_path / "ray"), "--engine", "ray", "--actors", "2",
                 "--shard-size", "16"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["documents"], summary["skipped_empty"], summary["truncated"]) == (
        single["documents"], single["skipped_empty"], single["truncated"]) == (100, 1, single["truncated"])
    assert summary["shards"] == 7 and summary["actors"] == 2 and summary["documents_encoded"] == 100
    _same_bundle(tmp_path / "one", tmp_path / "ray")
    assert read_bundle(tmp_path / "ray").manifest["index"]["engine"] == "ray"
    assert not (tmp_path / "ray.shards").exists()  # the work folder goes once the bundle is written


def test_ray_engine_reads_a_folder_of_jsonl_gz_and_parquet(cluster, tiny_bundle: Path, rows, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from esp_retrieval.training.indexing import index_corpus
    from esp_retrieval.training.ray_index import index_corpus_ray

    folder = tmp_path / "corpus"
    folder.mkdir()
    first, second = rows[:90], rows[90:150]
    _write_jsonl(folder / "a.jsonl.gz", first)
    pq.write_table(pa.Table.from_pylist([{"title": None, **r} for r in second]), folder / "b.parquet")
    _write_jsonl(tmp_path / "all.jsonl", first + [{"title": None, **r} for r in second])
    index_corpus(tiny_bundle, tmp_path / "all.jsonl", tmp_path / "one", progress=False)
    s = index_corpus_ray(tiny_bundle, folder, tmp_path / "ray", progress=False, actors=1, shard_size=32)
    assert s["documents"] == 150 and s["shards"] == 3 + 2
    _same_bundle(tmp_path / "one", tmp_path / "ray")


def test_killed_run_resumes_without_reencoding_finished_shards(cluster, tiny_bundle: Path, rows,
                                                               tmp_path: Path) -> None:
    from esp_retrieval.training.indexing import index_corpus
    from esp_retrieval.training.ray_index import index_corpus_ray

    corpus = tmp_path / "docs.jsonl"
    big = [{**r, "id": f"{r['id']}-{k}"} for k in range(4) for r in rows]  # 960 documents, 120 shards
    _write_jsonl(corpus, big)
    work = tmp_path / "work"
    shards = work / "shards"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "esp_retrieval.cli", "index", "--engine", "ray", "--address", cluster, "--actors", "1",
           "--shard-size", "8", "--bundle", str(tiny_bundle), "--corpus", str(corpus), "--out",
           str(tmp_path / "ray"), "--work-dir", str(work), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if shards.is_dir() and len(list(shards.glob("*.done.json"))) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the first run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    time.sleep(1.0)  # let a piece in flight land (or not): either is a valid state to resume from
    before = {m.name: m.stat().st_mtime_ns for m in shards.glob("*.done.json")}
    assert 3 <= len(before) < len(big) // 8
    s = index_corpus_ray(tiny_bundle, corpus, tmp_path / "ray", progress=False, actors=2, shard_size=8,
                         work_dir=work, keep_work=True)
    assert s["shards_reused"] == len(before)
    assert s["documents_encoded"] == len(big) - 8 * len(before)
    after = {m.name: m.stat().st_mtime_ns for m in shards.glob("*.done.json")}
    assert {k: after[k] for k in before} == before  # finished shards untouched
    index_corpus(tiny_bundle, corpus, tmp_path / "one", progress=False)
    _same_bundle(tmp_path / "one", tmp_path / "ray")
    with pytest.raises(CorpusError, match="work folder holds shards of another run"):
        index_corpus_ray(tiny_bundle, corpus, tmp_path / "ray2", progress=False, shard_size=16, work_dir=work)


# the reader is the single-process parser itself (tests/training/test_index.py has every case);
# these go through Ray's read tasks and wrappers (each run starts an actor pool: kept to two)
BAD = [
    ("dup.tsv", b"a\tone\nb\ttwo\na\tthree\n"),
    ("utf.jsonl", b'{"id": "a", "text": "x"}\n{"id": "b", "text": "t\xffwo"}\n'),
]


def test_bad_lines_reported_as_in_the_single_process_path(cluster, tiny_bundle: Path, tmp_path: Path,
                                                          capsys) -> None:
    for name, content in BAD:
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(CorpusError) as want:
            list(read_corpus(path))
        out = tmp_path / f"out-{name}"
        assert main(["index", "--engine", "ray", "--actors", "1", "--bundle", str(tiny_bundle), "--corpus",
                     str(path), "--out", str(out), "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == f"esp index: {want.value}", (name, err[-2000:])
        assert not out.exists()
