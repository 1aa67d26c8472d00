"""bench/knn.py on a tiny corpus: one JSON line with the keys the issue asks for."""

from __future__ import annotations

import json

import pytest

from bench import knn


def test_knn_bench_prints_one_json_line_with_its_keys(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--quick", "--sizes", "3000", "--batches", "1", "4", "--repeats", "1", "--k", "5"]
    assert knn.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    r = json.loads(lines[0])
    for key in ("ratio_vs_faiss", "ratio_vs_faiss_lowp"):
        assert set(r[key]) == {"1", "4"} and all(v > 0 for v in r[key].values())
    assert r["exact"] is True
    assert r["recall_lowp"] == 1.0
    # batch-1 scan against a read of the same bytes, timed in the same cell
    assert r["bandwidth_fraction"] > 0 and r["bandwidth_fraction_best"] > 0
    read = [c for c in r["cells"] if c["method"] == knn.READ]
    assert [c["batch"] for c in read] == [1]
    scan_qps, _ = knn.best_qps(r["cells"], knn.EXACT, 3000, 2, 1)
    assert r["bandwidth_fraction"] == pytest.approx(scan_qps / read[0]["qps"])
