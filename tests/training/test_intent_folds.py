"""Stratified k-fold hold-out of ORCAS-I: balanced per class, deterministic, a partition."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from esp_retrieval.training.config import SplitConfig
from esp_retrieval.training.data.objectives import DataContext, Split, build_objective, stratified_folds
from esp_retrieval.training.data.orcas import load_orcas


def test_folds_are_stratified_and_independent_of_row_order() -> None:
    keys = [f"q{i}" for i in range(103)]
    labels = [0] * 50 + [1] * 41 + [2] * 12
    folds = stratified_folds(keys, labels, 5)
    assert set(folds) == set(range(5))
    for c, n in Counter(labels).items():
        per_fold = Counter(f for f, lab in zip(folds, labels, strict=True) if lab == c)
        assert sum(per_fold.values()) == n
        assert max(per_fold.values()) - min(per_fold[f] for f in range(5)) <= 1  # n_c / k, +-1
    order = list(reversed(range(103)))
    shuffled = stratified_folds([keys[i] for i in order], [labels[i] for i in order], 5)
    assert [shuffled[order.index(i)] for i in range(103)] == folds


def test_fewer_than_two_folds_is_refused() -> None:
    with pytest.raises(ValueError, match="intent_folds must be >= 2"):
        stratified_folds(["a", "b"], [0, 1], 1)


def test_intent_folds_partition_orcas_and_are_stratified() -> None:
    orcas = load_orcas(None, "3")
    held: list[str] = []
    for f in range(5):
        data = build_objective("intent", DataContext(None, Split(intent_folds=5, intent_fold=f)), classes="3")
        assert not set(data.heldout.texts) & set(data.train.texts)  # type: ignore[union-attr]
        held += data.heldout.texts
        share = Counter(data.heldout.labels)
        total = Counter(orcas.labels)
        for c in total:
            assert abs(share[c] - total[c] / 5) <= 1
    assert sorted(held) == sorted(orcas.texts)  # every query held out exactly once


def test_fold_out_of_range_names_the_field() -> None:
    with pytest.raises(ValidationError, match="intent_fold must be in \\[0, 4\\]"):
        SplitConfig(intent_folds=5, intent_fold=5)
    with pytest.raises(ValueError, match="split.intent_fold must be in \\[0, 1\\]"):
        build_objective("intent", DataContext(None, Split(intent_folds=2, intent_fold=2)), classes="3")
