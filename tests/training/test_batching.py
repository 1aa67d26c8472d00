"""Pair-batch sampler: distinct anchors and positives per batch, full batches on small data."""

from __future__ import annotations

from itertools import islice

from esp_retrieval.training.data.batching import random_batches, unique_batches


def test_batches_hold_distinct_groups_and_keys_and_cover_every_row() -> None:
    groups = [f"q{i // 4}" for i in range(12)]  # 3 anchors with 4 positives each
    keys = [f"p{i}" for i in range(12)]
    batches = list(islice(unique_batches(groups, keys, batch_size=8, seed=1), 40))
    for b in batches:
        assert 1 <= len(b) <= 3  # full at the number of distinct groups, not at batch_size
        assert len({groups[i] for i in b}) == len(b) and len({keys[i] for i in b}) == len(b)
    assert sum(len(b) == 3 for b in batches) >= 30  # only a pass's tail can be short
    seen = [i for b in batches for i in b]
    assert set(seen[:24]) == set(range(12))  # every row within the first two passes' worth of rows


def test_shared_positive_is_never_twice_in_a_batch() -> None:
    groups = ["a", "b", "c", "d"]
    keys = ["x", "x", "y", "z"]
    for b in islice(unique_batches(groups, keys, batch_size=4, seed=0), 20):
        assert len({keys[i] for i in b}) == len(b) <= 3


def test_same_seed_same_batches() -> None:
    groups = [str(i % 7) for i in range(50)]
    keys = [str(i) for i in range(50)]
    a = list(islice(unique_batches(groups, keys, 5, seed=3), 30))
    assert a == list(islice(unique_batches(groups, keys, 5, seed=3), 30))
    assert a != list(islice(unique_batches(groups, keys, 5, seed=4), 30))
    first = list(islice(random_batches(10, 4, seed=0), 3))
    assert sorted(i for b in first for i in b) == list(range(10))
