"""bench/knn_gpu.py --smoke: the GPU bench's script runs anywhere and prints its one JSON line.

Without CUDA the smoke run uses numpy for the engine's array code, torch on the CPU and
faiss-cpu: it checks the script and the keys, not speed (the GPU figures need a device).
"""

from __future__ import annotations

import json

import pytest

from bench import knn_gpu


def test_smoke_run_prints_one_json_line_with_the_issue_keys(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--smoke", "--n", "3000", "--batches", "1", "8", "--k", "5", "40", "--cell-budget", "0.05"]
    assert knn_gpu.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["smoke"] is True and r["n"] == 3000 and r["dim"] == 384
    keys = {"b1_k5", "b8_k5", "b1_k40", "b8_k40"}
    assert set(r["ms_per_query"]["ours"]) == keys and all(v > 0 for v in r["ms_per_query"]["ours"].values())
    for other in ("torch", "faiss"):  # both import here (torch cpu, faiss-cpu in faiss-gpu's place)
        ratios = r[f"ratio_vs_{other}"]
        assert set(ratios) == keys and all(v > 0 for v in ratios.values())
        expect = r["ms_per_query"][other]["b8_k5"] / r["ms_per_query"]["ours"]["b8_k5"]
        assert ratios["b8_k5"] == pytest.approx(expect)
    assert r["copy_bandwidth_gbs"] > 0 and r["gemm_tflops"] > 0
    assert set(r["bandwidth_fraction"]) == set(r["tensor_core_fraction"]) == {"k5", "k40"}
    assert r["recall"]["ours"] == {"k5": 1.0, "k40": 1.0}  # exact, against a float64 brute force
    assert set(r["goals"]) >= {"bandwidth_fraction_ge_0_85", "recall_at_10_is_1"}
    assert len(r["cells"]) == 3 * 2 * 2
