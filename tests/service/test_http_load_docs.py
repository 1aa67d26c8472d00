"""bench/http_load.py over several corpus sizes: the list option, the crossover, one JSON line."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from bench.http_load import crossover, int_list, main


def _corpus(docs: int, ratio: float, concurrency: int = 32, mode: str = "batching") -> dict[str, Any]:
    level = {
        "concurrency": concurrency,
        "mode": mode,
        "client": "raw",
        "ratio": ratio,
        "cpu_ratio": ratio / 2,
    }
    return {"docs": docs, "levels": [level]}


def test_int_list_parses_and_refuses() -> None:
    assert int_list("24884,250000, 1000000") == [24884, 250000, 1000000]
    for bad in ("", "10,x", "0", "5,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
            int_list(bad)


def test_crossover_interpolates_in_log_docs() -> None:
    corpora = [_corpus(1_000_000, 0.9), _corpus(10_000, 0.5), _corpus(100_000, 0.8)]
    out = crossover(corpora, 32, 0.7)
    assert [p["docs"] for p in out["by_docs"]] == [10_000, 100_000, 1_000_000]  # sorted by size
    # 0.7 lies 2/3 of the way from 0.5 (10^4) to 0.8 (10^5) -> 10^(4 + 2/3)
    assert out["docs_estimate"] == round(10 ** (4 + 2 / 3))
    assert out["by_docs"][0] == {"docs": 10_000, "ratio": 0.5, "cpu_ratio": 0.25}


def test_crossover_edges_and_filters() -> None:
    assert crossover([_corpus(100, 0.2), _corpus(1000, 0.6)], 32, 0.7)["docs_estimate"] is None
    assert crossover([_corpus(100, 0.75), _corpus(1000, 0.9)], 32, 0.7)["docs_estimate"] == 100
    # other concurrency levels and modes are not read
    other = [_corpus(100, 0.9, concurrency=8), _corpus(1000, 0.9, mode="no_batching")]
    assert crossover(other, 32, 0.7)["by_docs"] == []


def test_docs_cannot_combine_with_a_bundle(tmp_path: Any) -> None:
    with pytest.raises(SystemExit):
        main(["--bundle", str(tmp_path), "--docs", "100,200"])


@pytest.mark.slow
@pytest.mark.live  # a server per corpus size
def test_main_measures_each_corpus_size(capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        "--docs 300,2000 --concurrency 1,2 --modes batching --seconds 0.3 --requests 10 --engine-seconds 0.02"
    )
    assert main(args.split()) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["docs"] == [300, 2000]
    assert [c["docs"] for c in out["corpora"]] == [300, 2000]
    for corpus in out["corpora"]:
        assert set(corpus["engine_qps"]) == {"1", "2"}
        assert all(q > 0 for q in corpus["engine_qps"].values())
        assert [(r["concurrency"], r["failures"]) for r in corpus["levels"]] == [(1, 0), (2, 0)]
        assert all(r["server_loop_cpu_ms_per_request"] >= 0 for r in corpus["levels"])  # the main thread's
        assert all(
            r["ratio"] == round(r["qps"] / corpus["engine_qps"][str(r["concurrency"])], 3)
            for r in corpus["levels"]
        )
    cross = out["crossover"]
    assert cross["concurrency"] == 2  # 32 is not run: the top level
    assert [p["docs"] for p in cross["by_docs"]] == [300, 2000]
