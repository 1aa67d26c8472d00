"""Named operating points on an ESP front, and writing them into a bundle's manifest.

An ESP checkpoint swept over serving weights gives a curve of ``{"weights", "metrics"}``
points. Three names pick points on its Pareto front (semantic NDCG@10 vs entity
precision@10, both maximised):

- ``semantic_first``: the highest semantic score (ties: higher entity score). When the curve
  carries the standard error of each point's semantic score over queries (``<metric>_se``), the
  one-standard-error rule (Breiman et al. 1984; Hastie, Tibshirani and Friedman, *Elements of
  Statistical Learning* 7.10) picks instead, among all swept points within one SE (at most
  ``semantic_budget``) of the best semantic score, the one with the largest share of weight on
  ``semantic_block``: on ~50 queries the best of 66 swept points is mostly selection noise, and
  the rule leans on the other blocks only where they measurably help. Being a one-axis choice it
  may be a point off the front, and where the other blocks help the semantic score it may score
  below ``entity_first`` on the queries it was chosen on;
- ``entity_first``: the highest entity score among front points whose semantic score is within
  ``semantic_budget`` (default 0.02 NDCG@10) of the front's best (ties: higher semantic score):
  entity-heavy ranking that a user can adopt without giving up relevance. With an infinite
  budget it is the front's entity extreme;
- ``balanced``: the front point nearest the utopia corner after min-max scaling each axis
  over the front (ties: the first in curve order).

The result has the shape the bundle manifest takes (docs/architecture.md section 4) and the service
serves: ``{name: {"weights": {...}, "description": str, "metrics": {...}}}``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.weights import resolve_block_weights, weights_dict
from esp_retrieval.training.evaluate.metrics import pareto_front

SEMANTIC_METRIC = "ndcg@10"
ENTITY_METRIC = "entity_p@10"

_DESCRIPTIONS = {
    "semantic_first": "highest semantic NDCG@10 on the held-out weight sweep (one-SE rule: the most "
    "semantic-weighted swept point within one standard error of the best)",
    "balanced": "front point nearest the best of both (min-max scaled semantic and entity axes)",
    "entity_first": "highest entity precision@10 on the held-out weight sweep within the semantic budget",
}


#: NDCG@10 that ``entity_first`` may give up against the front's best semantic point
SEMANTIC_BUDGET = 0.02


def _pick(xy: np.ndarray, front: np.ndarray, name: str, semantic_budget: float = SEMANTIC_BUDGET, *,
          se: np.ndarray | None = None, share: np.ndarray | None = None) -> int:
    fx, fy = xy[front, 0], xy[front, 1]
    if name == "semantic_first":
        top = int(front[np.lexsort((-fy, -fx))[0]])
        if se is None or share is None or not math.isfinite(float(se[top])):
            return top
        floor = xy[top, 0] - min(float(se[top]), semantic_budget)
        ok = np.nonzero(xy[:, 0] >= floor - 1e-12)[0]  # every swept point: one axis decides
        return int(ok[np.lexsort((-xy[ok, 0], -share[ok]))[0]])
    if name == "entity_first":
        ok = front[fx >= fx.max() - semantic_budget - 1e-12]
        return int(ok[np.lexsort((-xy[ok, 0], -xy[ok, 1]))[0]])
    span = np.maximum(xy[front].max(axis=0) - xy[front].min(axis=0), 1e-12)
    scaled = (xy[front] - xy[front].min(axis=0)) / span
    dist = np.hypot(1 - scaled[:, 0], 1 - scaled[:, 1])
    best = np.nonzero(np.isclose(dist, dist.min()))[0]
    return int(min(front[best]))


def _share(weights: Mapping[str, float], block: str) -> float:
    total = sum(float(v) for v in weights.values())
    return float(weights.get(block, 0.0)) / total if total > 0 else 0.0


def standard_error(values: Mapping[str, float]) -> float:
    """Standard error of the mean of per-query values (``nan`` below two queries)."""
    v = np.asarray(list(values.values()), dtype=np.float64)
    return float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan


def compute_operating_points(
    curve: Sequence[Mapping[str, Any]],
    layout: SubspaceLayout,
    *,
    x_metric: str = SEMANTIC_METRIC,
    y_metric: str = ENTITY_METRIC,
    names: Sequence[str] = ("semantic_first", "balanced", "entity_first"),
    context: str = "",
    semantic_budget: float = SEMANTIC_BUDGET,
    semantic_block: str = "semantic",
) -> dict[str, dict[str, Any]]:
    """Pick the named points of ``curve`` (each ``{"weights": {name: w}, "metrics": {...}}``;
    ``metrics[x_metric + "_se"]``, when every point has it, turns on the one-SE rule of
    ``semantic_first`` with ``semantic_block``'s weight share).

    Weights are validated against ``layout`` (as the service will) and completed to every
    layout name. ``context`` (e.g. the evaluation protocol) is appended to each description.
    """
    unknown = [n for n in names if n not in _DESCRIPTIONS]
    if unknown:
        raise ValueError(f"operating point names {unknown} are unknown; allowed: {sorted(_DESCRIPTIONS)}")
    pts = [p for p in curve if all(math.isfinite(float(p["metrics"][m])) for m in (x_metric, y_metric))]
    if not pts:
        raise ValueError(f"curve has no point with finite {x_metric!r} and {y_metric!r}")
    xy = np.array([[float(p["metrics"][x_metric]), float(p["metrics"][y_metric])] for p in pts])
    front = pareto_front(xy)
    se = share = None
    if all(x_metric + "_se" in p["metrics"] for p in pts) and semantic_block in layout:
        se = np.array([float(p["metrics"][x_metric + "_se"]) for p in pts])
        share = np.array([_share(p["weights"], semantic_block) for p in pts])
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        p = pts[_pick(xy, front, name, semantic_budget, se=se, share=share)]
        w = resolve_block_weights(dict(p["weights"]), layout, field=f"operating_points.{name}.weights")
        desc = _DESCRIPTIONS[name] + (f" ({context})" if context else "")
        out[name] = {
            "weights": weights_dict(w, layout),
            "description": desc,
            "metrics": {k: float(v) for k, v in p["metrics"].items()},
        }
    return out


def write_operating_points(bundle_path: str | Path, points: Mapping[str, Mapping[str, Any]]) -> Path:
    """Replace the ``operating_points`` section of an existing bundle, keeping everything else.

    The bundle is re-written atomically with :func:`esp_retrieval.subspace.bundle.write_bundle` (embeddings,
    ids, docs, encoder and every other manifest section carried over unchanged); every weight
    is validated against the bundle's layout first (its sparse blocks' names included: the
    weights a request may carry), so a bad point never reaches the service; the sparse blocks
    are carried over with their default weights.
    """
    path = Path(bundle_path)
    bundle = read_bundle(path, mmap=False)
    names = bundle.weight_layout
    clean: dict[str, Any] = {}
    for name, point in points.items():
        if not isinstance(point, Mapping) or "weights" not in point:
            raise ValueError(f"operating_points.{name} must be an object with 'weights'")
        field = f"operating_points.{name}.weights"
        w = resolve_block_weights(dict(point["weights"]), names, field=field)
        clean[name] = {**copy.deepcopy(dict(point)), "weights": weights_dict(w, names)}
    reserved = {"format_version", "version", "layout", "corpus", "files", "sparse"}
    sections = {k: v for k, v in bundle.manifest.items() if k not in reserved}
    sections["operating_points"] = clean
    return write_bundle(
        path,
        bundle.layout,
        np.array(bundle.embeddings),
        bundle.ids,
        docs=bundle.docs(),
        encoder_dir=bundle.encoder_dir,
        sections=sections,
        overwrite=True,
        sparse=bundle.sparse,
        sparse_weights=bundle.sparse_defaults,
    )


def attach_operating_points(
    bundle_path: str | Path,
    model: Any,
    config: Any,
    *,
    step: float = 0.1,
) -> dict[str, dict[str, Any]]:
    """Sweep a freshly exported ESP bundle over serving weights on the training run's held-out
    TREC DL year and write the named operating points into it (``esp train`` calls this).

    ``model``: the trained :class:`esp_retrieval.training.model.ESPModel` (its ``encode`` embeds the queries);
    ``config``: its :class:`training.config.TrainConfig`. Returns ``{}`` and leaves the bundle as
    it is when the points cannot be measured honestly: a single-head layout, a corpus that is
    not the TREC DL passage pool, or a split other than a held-out year.
    """
    import logging

    from esp_retrieval.subspace.scoring import normalize_blocks
    from esp_retrieval.training.evaluate.benchmark import load_dl
    from esp_retrieval.training.evaluate.retrieval import score_dl_sweep, simplex_grid

    log = logging.getLogger(__name__)
    path = Path(bundle_path)
    bundle = read_bundle(path, mmap=False)
    layout = bundle.layout
    if len(layout) < 2 or config.split.by != "year":
        log.info("operating points: skipped (needs an ESP layout and a held-out year split)")
        return {}
    from esp_retrieval.training.data import DEFAULT_DATA_DIR

    data_dir = Path(config.data_dir) if config.data_dir else DEFAULT_DATA_DIR
    bench = load_dl(data_dir / "trec-dl-2019-2020-passage")
    row_of = {pid: i for i, pid in enumerate(bundle.ids)}
    if set(row_of) != set(bench.pids):
        log.info("operating points: skipped (the bundle corpus is not the TREC DL passage pool)")
        return {}
    corpus = np.asarray(bundle.embeddings)[[row_of[p] for p in bench.pids]]
    year = config.split.heldout_year
    qids = list(bench.queries[year])
    texts = [bench.queries[year][x] for x in qids]
    q = normalize_blocks(np.asarray(model.encode(texts), np.float32), layout)
    queries = dict(zip(qids, q.astype(corpus.dtype), strict=True))
    order = [row_of[p] for p in bench.pids]  # the sparse blocks' scores, in the corpus order above
    sparse = {name: block.scores(block.encode(texts))[:, order] for name, block in bundle.sparse.items()}
    names = bundle.weight_layout  # the sweep weighs the sparse blocks too: the points are measured
    grid = simplex_grid(list(names.names), step)
    scores = score_dl_sweep(bench, corpus, queries, layout, sweep=grid, year=year, sparse=sparse or None)
    curve = []
    for w, s in zip(grid, scores, strict=True):
        curve.append({"weights": w, "metrics": {SEMANTIC_METRIC: s.ndcg, ENTITY_METRIC: s.entity_p,
                                                SEMANTIC_METRIC + "_se": standard_error(s.per_query_ndcg)}})
    points = compute_operating_points(
        curve, names, context=f"held-out {year} queries of this training run, weight grid step {step}")
    write_operating_points(path, points)
    return points
