"""Paired significance over queries: is method A's per-query metric different from method B's?

Seed standard deviations say how much a number moves with the training seed; they say nothing
about whether a difference between two methods holds across queries. Each comparison here pairs
the two methods' values of the same held-out queries (each query's value averaged over seeds
first) and reports the mean difference with a two-sided paired t-test and the Wilcoxon
signed-rank test (scipy), the tests ranx's ``compare`` offers for IR runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PairedTest:
    """``mean(a - b)`` over ``n`` shared queries, with both tests' two-sided p-values."""

    n: int
    mean_a: float
    mean_b: float
    diff: float
    p_ttest: float
    p_wilcoxon: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mean_over_seeds(per_seed: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``[{qid: v} per seed] -> {qid: mean v}`` over the seeds that scored the query."""
    acc: dict[str, list[float]] = {}
    for d in per_seed:
        for q, v in d.items():
            acc.setdefault(q, []).append(float(v))
    return {q: float(np.mean(v)) for q, v in acc.items()}


def paired_test(a: Mapping[str, float], b: Mapping[str, float]) -> PairedTest:
    """Paired tests of ``a`` vs ``b`` on the queries both score (NaN p-values when all equal)."""
    from scipy import stats

    qids = sorted(set(a) & set(b))
    x = np.array([a[q] for q in qids], dtype=np.float64)
    y = np.array([b[q] for q in qids], dtype=np.float64)
    d = x - y
    if len(qids) < 2 or np.allclose(d, 0.0):
        p_t = p_w = math.nan if len(qids) < 2 else 1.0
    else:
        p_t = float(stats.ttest_rel(x, y).pvalue)
        p_w = float(stats.wilcoxon(x, y, zero_method="wilcox").pvalue)
    return PairedTest(len(qids), _mean(x), _mean(y), _mean(d), p_t, p_w)


def _mean(v: np.ndarray) -> float:
    return float(v.mean()) if len(v) else math.nan
