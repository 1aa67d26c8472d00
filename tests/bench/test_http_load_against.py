"""bench/http_load.py --against: this checkout's server against another checkout's, in one run.

Here the other checkout is this one (the plumbing: a second tree's code served by path, rounds
alternating, one ratio per round); a real comparison names a worktree of an earlier commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import http_load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.live  # servers of both trees
@pytest.mark.slow
def test_against_measures_both_trees_alternating(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--docs", "2000", "--concurrency", "4", "--modes", "batching", "--seconds", "1", "--requests", "300",
            "--engine-seconds", "0.2", "--against", str(ROOT), "--rounds", "2"]
    assert http_load.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    against = out["corpora"][0]["against"]
    assert against["other"] == str(ROOT) and against["concurrency"] == 4
    assert len(against["rounds"]) == 2
    for r in against["rounds"]:
        assert r["this_qps"] > 0 and r["other_qps"] > 0
        assert r["ratio"] == pytest.approx(r["this_qps"] / r["other_qps"], rel=1e-2)
    assert against["ratio_median"] > 0


def test_against_a_folder_that_is_no_checkout_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        http_load.main(["--against", str(tmp_path)])
    assert exit_.value.code == 2
    assert "not a checkout of this repository" in capsys.readouterr().err
