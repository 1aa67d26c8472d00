"""bench/milvus.py on a tiny corpus: one JSON line; the exact ways are exact at every weight vector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("milvus_lite")

from bench import milvus

pytestmark = pytest.mark.slow  # an embedded Milvus Lite server, several indexes


def test_milvus_bench_prints_one_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--sizes",
        "1500",
        "--dims",
        "8",
        "4",
        "4",
        "--queries",
        "2",
        "--nlist",
        "4",
        "--nprobe",
        "1",
        "4",
        "--candidates",
        "20",
        "--hybrid-limits",
        "10",
        "--workdir",
        str(tmp_path),
    ]
    assert milvus.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    (run,) = json.loads(lines[0])["runs"]
    methods = run["methods"]
    assert methods["numpy"]["recall_min"] == methods["milvus_flat"]["recall_min"] == 1.0
    assert len(methods["milvus_flat"]["recall_at_10"]) == len(milvus.WEIGHT_GRID)
    assert 0.0 <= methods["hybrid_weighted_ranker_limit10"]["recall_min"] <= 1.0
    assert "nprobe_honoured" in run
    for nprobe in (1, 4):  # the sweep: one entry per nprobe, its settings recorded
        m = methods[f"milvus_ivf_flat_nlist4_nprobe{nprobe}_c20"]
        assert m["params"] == {"nlist": 4, "nprobe": nprobe, "candidates": 20}
        assert min(m["recall_at_10"].values()) == m["recall_min"] <= m["recall_mean"] <= 1.0
    hnsw = [k for k in methods if k.startswith("milvus_hnsw")]  # Milvus Lite 2.5 builds no HNSW
    assert hnsw and all("skipped" in methods[k] or methods[k]["recall_min"] <= 1.0 for k in hnsw)
    assert methods["milvus_flat"]["ms_ratio_vs_numpy"] > 0


def test_the_load_rate_mode_prints_one_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--load-baseline", "--sizes", "600", "--baseline-rows", "300", "--dims", "8", "4", "4"]
    assert milvus.main([*argv, "--workdir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["bench"] == "milvus_load" and out["n"] == 600 and out["dim"] == 16
    methods = out["methods"]
    assert {m: methods[m]["rows"] for m in methods} == {
        "old_upserts_2000": 300,
        "row_inserts_1mib": 300,
        "esp_milvus_load": 300,
        "esp_milvus_load_all": 600,
    }
    assert out["ratio_vs_old"] > 0 and methods["esp_milvus_load"]["batch"] == (1 << 20) // (4 * 16)
