"""bench/ann.py --quick on the tiny bundle: one JSON line with the issue's keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import ann


def test_ann_bench_prints_one_json_line_with_its_keys(
    tiny_bundle: Path, tiny_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esp_retrieval.training.data.trec import TREC_DIR

    data = str(tiny_data_dir / TREC_DIR)
    # --exact-below 0: time the probing itself (at 3000 rows the backend would take the exact scan)
    argv = ["--quick", "--n", "3000", "--exact-below", "0", "--bundle", str(tiny_bundle), "--data", data]
    assert ann.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["n"] == 3000 and r["truth_agrees_with_exact_engine"] == 1.0
    assert r["weight_vectors"] == len(r["per_weight"]) == len(ann.simplex_grid(len(r["layout"]), 0.5))
    for budget, cell in r["summary"]["per_budget"].items():
        assert 0.0 <= cell["ivf_worst_recall"] <= cell["ivf_mean_recall"] <= 1.0
        assert 0.0 <= cell["faiss_ivf_worst_recall"] <= 1.0
        assert 0 < cell["ivf_touched_mean"] <= 2 * float(budget.removeprefix("budget"))
        assert cell["ms_b1_mean"] > 0 and cell["speedup_b1_vs_exact"] > 0
        assert cell["ivf_modes"] == ["ivf"]
    assert set(r["per_weight"][0]["hnsw"]) == {"ef64"}
    assert r["build"]["ivf_bytes"] > 0 and r["summary"]["ms_b1"]["exact"] > 0


def test_ann_bench_without_budgets_runs_pq_alone(
    tiny_bundle: Path, tiny_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from esp_retrieval.training.data.trec import TREC_DIR

    data = str(tiny_data_dir / TREC_DIR)
    argv = ["--quick", "--n", "3000", "--exact-below", "0", "--max-touched", "--pq-screens", "500",
            "--no-hnsw", "--bundle", str(tiny_bundle), "--data", data]  # fmt: skip
    assert ann.main(argv) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["summary"]["per_budget"] == {} and r["build"]["ivf_seconds"] is None
    assert r["summary"]["ms_b1"]["faiss_ivf_at_largest_budget"] is None
    cell = r["summary"]["per_pq_screen"]["screen500"]
    assert cell["pq_modes"] == ["pq"] and 0.0 < cell["pq_worst_recall"] <= 1.0
