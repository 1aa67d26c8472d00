"""bench/train_step.py on the tiny BERT: both modes run the trainer's real step and report ratios."""

from __future__ import annotations

import pytest

from bench import train_step

pytestmark = pytest.mark.slow


def test_train_step_bench_reports_both_modes_and_ratios() -> None:
    r = train_step.run("tiny", 2, 8, None)
    for mode in ("frozen", "top:2"):
        assert set(r[mode]) >= {"pcgrad+dwa", "sum+equal"} and all(v > 0 for v in r[mode].values())
        assert r[f"ratio_{mode}"] == pytest.approx(r[mode]["pcgrad+dwa"] / r[mode]["sum+equal"], rel=0.01)
