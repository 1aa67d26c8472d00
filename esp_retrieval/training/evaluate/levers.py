"""One row per lever of the recipe: the method with it against the same method without it.

A lever (``levers:`` in ``configs/eval.yaml``) names two methods that differ in one thing (a
sparse block, a trained query tower, PCGrad + DWA, ...). Each row compares them on the seeds
both were trained with: per-query NDCG@10 and entity P@10 at default weights, paired over the
held-out queries (:mod:`esp_retrieval.training.evaluate.significance`), the intent macro-F1 and the
hypervolume of each method's front (mean over those seeds), and a verdict read off the paired
tests (:func:`verdict`), so a lever that moves nothing beyond query noise says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from esp_retrieval.training.evaluate.significance import PairedTest, paired_test

#: a paired difference counts when its two-sided t-test p-value is below this
ALPHA = 0.05
METRIC_NAMES = {"ndcg@10": "NDCG@10", "entity_p@10": "entity P@10"}


def verdict(tests: Mapping[str, PairedTest], alpha: float = ALPHA) -> str:
    """``helps`` / ``hurts`` / ``trade-off`` / ``no significant effect``, from which metrics moved
    up or down with ``p < alpha`` (the named metrics follow in brackets)."""
    up = [METRIC_NAMES.get(m, m) for m, t in tests.items() if t.diff > 0 and t.p_ttest < alpha]
    down = [METRIC_NAMES.get(m, m) for m, t in tests.items() if t.diff < 0 and t.p_ttest < alpha]
    if up and down:
        return f"trade-off (up: {', '.join(up)}; down: {', '.join(down)})"
    if up:
        return f"helps ({', '.join(up)})"
    if down:
        return f"hurts ({', '.join(down)})"
    return f"no significant effect (p >= {alpha:g} on both)"


def compare(
    name: str,
    method: str,
    baseline: str,
    *,
    per_method: Mapping[str, Any],
    per_query: Callable[[Mapping[str, Any], str, Sequence[Any]], dict[str, float]],
    metrics: Sequence[str],
) -> dict[str, Any]:
    """The lever's row. ``per_method[m]``: ``seeds``, ``per_seed`` (metrics by seed), ``hv`` (one
    hypervolume per seed, in ``seeds`` order); ``per_query(pm, metric, seeds)``: ``{qid: value}``
    averaged over ``seeds``. A method that needs no training (seed ``None``) pairs with any seed."""
    a, b = per_method[method], per_method[baseline]
    seeds = _shared_seeds(a["seeds"], b["seeds"])
    if not seeds:
        raise ValueError(
            f"lever {name!r}: {method} and {baseline} share no seed ({a['seeds']}, {b['seeds']})")
    tests = {m: paired_test(per_query(a, m, _own(a, seeds)), per_query(b, m, _own(b, seeds)))
             for m in metrics}
    hv = [_mean_at(x, x["hv"], seeds) for x in (a, b)]
    f1 = [_mean_at(x, [x["per_seed"][s]["intent_f1"] for s in x["seeds"]], seeds) for x in (a, b)]
    return {
        "lever": name, "method": method, "baseline": baseline, "seeds": [s for s in seeds if s is not None],
        "tests": {m: t.to_dict() for m, t in tests.items()},
        "hypervolume_diff": hv[0] - hv[1],
        "intent_f1_diff": f1[0] - f1[1] if all(math.isfinite(v) for v in f1) else math.nan,
        "verdict": verdict(tests),
    }


def _shared_seeds(a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
    if None in a:
        return list(b)
    if None in b:
        return list(a)
    return [s for s in a if s in b]


def _own(pm: Mapping[str, Any], seeds: Sequence[Any]) -> list[Any]:
    """The seeds of ``pm`` to use: ``[None]`` for a method without training."""
    return [None] if None in pm["seeds"] else list(seeds)


def _mean_at(pm: Mapping[str, Any], values: Sequence[float], seeds: Sequence[Any]) -> float:
    own = _own(pm, seeds)
    return float(np.mean([v for s, v in zip(pm["seeds"], values, strict=True) if s in own]))
