"""A lever's row (esp_retrieval/training/evaluate/levers.py): paired on the shared seeds, and a
verdict that says when nothing moved beyond query noise."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from esp_retrieval.training.evaluate.levers import compare, verdict
from esp_retrieval.training.evaluate.significance import PairedTest

QIDS = [f"q{i}" for i in range(40)]


def _test(diff: float, p: float) -> PairedTest:
    return PairedTest(n=40, mean_a=0.5 + diff, mean_b=0.5, diff=diff, p_ttest=p, p_wilcoxon=p)


@pytest.mark.parametrize(
    ("ndcg", "entity", "expected"),
    [
        ((+0.03, 0.001), (+0.01, 0.40), "helps (NDCG@10)"),
        ((-0.03, 0.001), (-0.02, 0.01), "hurts (NDCG@10, entity P@10)"),
        ((-0.03, 0.001), (+0.02, 0.01), "trade-off (up: entity P@10; down: NDCG@10)"),
        ((+0.03, 0.20), (-0.02, 0.06), "no significant effect (p >= 0.05 on both)"),
    ],
)
def test_the_verdict_counts_only_paired_differences_below_alpha(
    ndcg: tuple[float, float], entity: tuple[float, float], expected: str
) -> None:
    assert verdict({"ndcg@10": _test(*ndcg), "entity_p@10": _test(*entity)}) == expected


def _method(seeds: Sequence[Any], offset: float, f1: float) -> dict[str, Any]:
    """Per-query values ``base + offset + seed/100`` so the seeds used are visible in the means."""
    return {"seeds": list(seeds), "offset": offset,
            "per_seed": {s: {"intent_f1": f1 + (s or 0) / 10} for s in seeds},
            "hv": [0.5 + offset + (s or 0) / 100 for s in seeds]}


def _per_query(pm: Mapping[str, Any], metric: str, seeds: Sequence[Any]) -> dict[str, float]:
    """``offset`` + the mean of ``seed / 100`` + a query's spread + a little noise of the method's own."""
    salt = round(pm["offset"] * 100) + len(pm["seeds"])
    spread = [((i % 7) - 3) / 100 + ((i * 3 + salt) % 5 - 2) / 2000 for i in range(len(QIDS))]
    return {q: 0.5 + pm["offset"] + d + sum((s or 0) / 100 for s in seeds) / len(seeds)
            for q, d in zip(QIDS, spread, strict=True)}


def test_a_row_pairs_the_methods_on_the_seeds_both_trained() -> None:
    per_method = {"on": _method([0], 0.02, 0.60), "off": _method([0, 1, 2], 0.0, 0.55)}
    row = compare("lever", "on", "off", per_method=per_method, per_query=_per_query,
                  metrics=("ndcg@10", "entity_p@10"))
    assert row["seeds"] == [0]
    # seed 0 alone on both sides: the difference is the offset, not the other seeds' spread
    assert row["tests"]["ndcg@10"]["diff"] == pytest.approx(0.02, abs=1e-3)
    assert row["hypervolume_diff"] == pytest.approx(0.02)
    assert row["intent_f1_diff"] == pytest.approx(0.05)
    assert row["verdict"] == "helps (NDCG@10, entity P@10)"


def test_a_method_without_training_pairs_with_every_seed() -> None:
    per_method = {"on": _method([0, 1], 0.0, 0.6), "zero": _method([None], 0.0, math.nan)}
    row = compare("lever", "on", "zero", per_method=per_method, per_query=_per_query, metrics=("ndcg@10",))
    assert row["seeds"] == [0, 1]
    assert row["tests"]["ndcg@10"]["diff"] == pytest.approx(0.005, abs=1e-3)  # mean of seeds 0 and 1: +0.5/100
    assert math.isnan(row["intent_f1_diff"])


def test_methods_that_share_no_seed_are_refused() -> None:
    per_method = {"a": _method([0], 0.0, 0.5), "b": _method([1], 0.0, 0.5)}
    with pytest.raises(ValueError, match="share no seed"):
        compare("lever", "a", "b", per_method=per_method, per_query=_per_query, metrics=("ndcg@10",))
