"""bench/milvus.py on a tiny corpus: one JSON line; the exact ways are exact at every weight vector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("milvus_lite")

from bench import milvus


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
    assert "milvus_ivf_flat_nlist4_c20" in methods and "nprobe_honoured" in run
    assert methods["milvus_flat"]["ms_ratio_vs_numpy"] > 0
