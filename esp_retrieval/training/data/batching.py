"""Mini-batch samplers (infinite, seeded).

In-batch-negative losses treat every other row of the batch as a negative, so a pair batch
never holds two rows of the same anchor group nor the same positive text twice. Rows that
would collide are deferred to the next batch, so every row is still seen once per epoch.
A batch can never hold more rows than there are distinct groups (or keys): it is full at
that size, so small data sets (a few dozen training queries) still yield many batches per pass.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence


def unique_batches(
    groups: Sequence[str], keys: Sequence[str], batch_size: int, seed: int = 0
) -> Iterator[list[int]]:
    """Row-index batches with distinct ``groups`` and distinct ``keys``, forever."""
    if not groups:
        raise ValueError("cannot sample batches from an empty data set")
    rng = random.Random(seed)
    full = min(batch_size, len(set(groups)), len(set(keys)))
    pending: list[int] = []
    while True:
        order = list(range(len(groups)))
        rng.shuffle(order)
        queue = pending + order
        pending = []
        batch: list[int] = []
        seen_g: set[str] = set()
        seen_k: set[str] = set()
        for i in queue:
            if groups[i] in seen_g or keys[i] in seen_k:
                pending.append(i)
                continue
            batch.append(i)
            seen_g.add(groups[i])
            seen_k.add(keys[i])
            if len(batch) == full:
                yield batch
                batch, seen_g, seen_k = [], set(), set()
        if batch:
            yield batch
        if len(pending) > len(groups):  # degenerate data (one group): give up deferring
            pending = []


def random_batches(n: int, batch_size: int, seed: int = 0) -> Iterator[list[int]]:
    """Shuffled epochs of ``range(n)`` cut into batches, forever."""
    if n == 0:
        raise ValueError("cannot sample batches from an empty data set")
    rng = random.Random(seed)
    while True:
        order = list(range(n))
        rng.shuffle(order)
        for s in range(0, n, batch_size):
            yield order[s : s + batch_size]
