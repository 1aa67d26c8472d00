"""What a micro-batch costs the engine: ``fixed + per_query * n`` seconds for ``n`` queries.

An exhaustive scan reads the whole index once per batch, whatever the batch holds, so much of a
batch's cost is fixed: on the demo-sized synthetic corpus (24,884 x 384, numpy, one core) a
search takes 3.6 ms at 2 queries, 4.5 ms at 8 and 10.7 ms at 32 (a single query runs a row-dot
kernel: 1.8 ms). A forecast that prices the queue at the last batches' seconds *per query*
(their time over their queries) charges each query ahead a whole scan: 8 queued queries of
one-query batches are forecast as 8 scans, about 14 ms, where one batch of 8 takes 4.5 ms. The
affine model charges the scan once per batch and each query its marginal cost (its encode, its
share of the matrix product).

:func:`fit_batch_cost` fits the two terms by least squares over recent batches ``(queries,
seconds)``; where they do not tell the two apart (every batch the same size), it keeps the
earlier fit's per-query term and refits the fixed term to the level measured now (a reload to a
larger corpus raises it), or, before any fit, charges the whole cost per query (the
proportional model: cautious until the engine has shown its shape).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BatchCost", "fit_batch_cost"]


@dataclass(frozen=True, slots=True)
class BatchCost:
    """``fixed + per_query * n`` seconds for a batch of ``n`` queries; ``fitted``: the two terms
    were told apart by batches of different sizes (else the fixed term is a level over a slope
    measured earlier, or 0)."""

    fixed: float
    per_query: float
    fitted: bool = False

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_query * n

    def queue(self, queries: int, batches: int) -> float:
        """Seconds to run ``queries`` queries in ``batches`` batches."""
        return batches * self.fixed + queries * self.per_query


def fit_batch_cost(
    batches: Iterable[tuple[int, float]], previous: BatchCost | None = None
) -> BatchCost | None:
    """The cost model of ``batches`` (``(queries, seconds)`` each); None when there are none.

    Least squares of seconds on queries, both terms kept non-negative (a negative slope, noise
    over batches of near-equal size, is read as no marginal cost; a negative intercept as none
    fixed). Batches all of one size: ``previous``'s slope (when it was fitted) under the level
    measured now, else the proportional model.
    """
    points = [(n, dt) for n, dt in batches if n > 0]
    if not points:
        return None
    count = len(points)
    mean_n = sum(n for n, _ in points) / count
    mean_dt = sum(dt for _, dt in points) / count
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    if spread > 0:
        slope = sum((n - mean_n) * (dt - mean_dt) for n, dt in points) / spread
        if slope <= 0:
            return BatchCost(mean_dt, 0.0, fitted=True)
        intercept = mean_dt - slope * mean_n
        if intercept < 0:
            return BatchCost(0.0, mean_dt / mean_n, fitted=True)
        return BatchCost(intercept, slope, fitted=True)
    if previous is not None and previous.fitted and math.isfinite(previous.per_query):
        slope = min(previous.per_query, mean_dt / mean_n)
        return BatchCost(mean_dt - slope * mean_n, slope, fitted=True)
    return BatchCost(0.0, mean_dt / mean_n)
