"""How runs are pooled into per-seed numbers: per-query means, out-of-fold intent predictions."""

from __future__ import annotations

from pathlib import Path

import pytest

from esp_retrieval.subspace.metrics import macro_f1
from esp_retrieval.training.evaluate.config import load_eval_config
from esp_retrieval.training.evaluate.evaluator import ModelEval
from esp_retrieval.training.evaluate.report import pool_queries, seed_metrics
from esp_retrieval.training.evaluate.runner import Run

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "eval.yaml"


def _run(year: str, fold: int, ndcg: dict[str, float], *, true: list[int], pred: list[int],
         agree: float) -> Run:
    ev = ModelEval(ndcg=ndcg, entity_p=dict(ndcg), intent_true=true, intent_pred=pred, agreement=agree,
                   agreement_intent_only=agree, tau=0.5, erank={"all": 2.0})
    return Run("m", 0, year, fold, list(range(len(true))), ev)


def test_pool_queries_means_each_query_over_the_runs_that_scored_it() -> None:
    assert pool_queries([{"a": 1.0, "b": 0.0}, {"a": 0.5}, {"c": 0.25}]) == {"a": 0.75, "b": 0.0, "c": 0.25}


def test_seed_metrics_pool_queries_and_out_of_fold_predictions() -> None:
    runs = [
        _run("dl20", 0, {"q1": 1.0, "q2": 0.0}, true=[0, 1, 2], pred=[0, 1, 1], agree=1.0),
        _run("dl19", 1, {"q3": 0.5}, true=[2, 2], pred=[2, 0], agree=0.0),
        _run("dl20", 2, {"q1": 0.0, "q2": 0.0}, true=[0], pred=[0], agree=1.0),
    ]
    m = seed_metrics(runs, n_classes=3)
    assert m["ndcg@10"] == pytest.approx((0.5 + 0.0 + 0.5) / 3)  # q1 averaged over its two models
    assert m["n_queries"] == 3
    assert m["intent_f1"] == pytest.approx(macro_f1([0, 1, 2, 2, 2, 0], [0, 1, 1, 2, 0, 0], [0, 1, 2]))
    assert m["n_intent_predictions"] == 6
    assert m["agreement@10"] == pytest.approx((3 * 1.0 + 2 * 0.0 + 1 * 1.0) / 6)  # weighted by test size


def test_schedule_alternates_years_over_the_intent_folds() -> None:
    cfg = load_eval_config(CONFIG)
    assert cfg.intent_folds == 5
    assert cfg.schedule() == [("dl20", 0), ("dl19", 1), ("dl20", 2), ("dl19", 3), ("dl20", 4)]
    split = cfg.training_config("esp", seed=1, heldout_year="dl19", intent_fold=3).split
    assert (split.heldout_year, split.intent_folds, split.intent_fold) == ("dl19", 5, 3)
    no_folds = cfg.model_copy(update={"intent_folds": None})
    assert no_folds.schedule() == [("dl20", None), ("dl19", None)]
