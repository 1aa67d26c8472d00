"""Aggregate the runs into tables, plots, operating points and ``esp-bench.md``.

Numbers per seed: the runs of a seed are pooled per query (NDCG@10, entity P@10, sweeps: the
mean over the runs that held the query out), per ORCAS-I query (intent macro-F1 and
agreement@10 over the pooled out-of-fold predictions) or averaged (tau, effective rank).
Tables show the mean ± sample std over seeds; the seeds are listed in every caption.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.subspace.atomic import atomic_write_text
from esp_retrieval.subspace.bundle import json_default
from esp_retrieval.subspace.metrics import macro_f1
from esp_retrieval.training.evaluate.diagnostics import StepLog, read_log, rolling_mean, summarize
from esp_retrieval.training.evaluate.keyword_clustering import ClusterSpec, cluster_scores
from esp_retrieval.training.evaluate.levers import ALPHA, compare
from esp_retrieval.training.evaluate.metrics import hypervolume_2d, pareto_front
from esp_retrieval.training.evaluate.operating_points import (
    ENTITY_METRIC,
    SEMANTIC_METRIC,
    compute_operating_points,
    standard_error,
)
from esp_retrieval.training.evaluate.runner import Context, Run
from esp_retrieval.training.evaluate.significance import mean_over_seeds, paired_test
from esp_retrieval.training.evaluate.tables import fmt, markdown_table, mean_std

REPORT = "esp-bench.md"
RESULTS = "esp-bench.json"
X, Y = SEMANTIC_METRIC, ENTITY_METRIC


def _mean(d: Mapping[str, float]) -> float:
    return float(np.mean(list(d.values()))) if d else math.nan


def weight_names(layout: Any, sparse: Any) -> Any:
    """The names a swept weight vector carries: the model's blocks, then its sparse block (as a
    one-column entry: the operating points only validate and order weights by it)."""
    if sparse is None:
        return layout
    from esp_retrieval.subspace.layout import SubspaceLayout

    dims = dict(zip(layout.names, layout.dims, strict=True))
    defaults = dict(zip(layout.names, (float(w) for w in layout.default_weights()), strict=True))
    return SubspaceLayout.from_dims({**dims, sparse.name: 1},
                                    default_weights={**defaults, sparse.name: sparse.default_weight})


def _weighted(values: Sequence[float], weights: Sequence[int]) -> float:
    """Weighted mean; NaN when nothing was weighed (a method without an intent hold-out)."""
    return float(np.average(values, weights=weights)) if sum(weights) > 0 else math.nan


def pool_queries(per_run: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-query mean over the runs that scored the query: ``[{qid: v}] -> {qid: mean v}``."""
    acc: dict[str, list[float]] = defaultdict(list)
    for d in per_run:
        for q, v in d.items():
            acc[q].append(v)
    return {q: float(np.mean(v)) for q, v in acc.items()}


def by_seed(runs: Sequence[Run], method: str) -> dict[int | None, list[Run]]:
    out: dict[int | None, list[Run]] = defaultdict(list)
    for r in runs:
        if r.method == method:
            out[r.seed].append(r)
    return dict(out)


def seed_metrics(group: Sequence[Run], n_classes: int) -> dict[str, float]:
    """One seed's metrics: per-query pooling over its runs (TREC DL queries: mean over the runs
    that held them out; ORCAS-I: the out-of-fold predictions of all runs), run means otherwise."""
    ndcg = pool_queries([r.result.ndcg for r in group])
    ent = pool_queries([r.result.entity_p for r in group])
    true = [t for r in group if r.result.intent_pred for t in r.result.intent_true]
    pred = [p for r in group if r.result.intent_pred for p in r.result.intent_pred]
    n_test = [len(r.result.intent_true) for r in group]
    out = {
        X: _mean(ndcg),
        Y: _mean(ent),
        "n_queries": float(len(ndcg)),
        "n_entity_queries": float(len(ent)),
        "intent_f1": macro_f1(true, pred, list(range(n_classes))) if pred else math.nan,
        "n_intent_predictions": float(len(pred)),
        "agreement@10": _weighted([r.result.agreement for r in group], n_test),
        "agreement@10_intent_block": _weighted([r.result.agreement_intent_only for r in group], n_test),
        "tau_sem_ent": float(np.nanmean([r.result.tau for r in group])) if any(
            math.isfinite(r.result.tau) for r in group) else math.nan,
    }
    for key in group[0].result.erank:
        out[f"erank[{key}]"] = float(np.mean([r.result.erank[key] for r in group]))
    return out


def seed_curve(group: Sequence[Run]) -> list[dict[str, Any]]:
    """Pooled sweep of one seed: per weight vector, NDCG / entity P over all held-out queries."""
    if not group or not group[0].result.sweep:
        return []
    curve = []
    for i, point in enumerate(group[0].result.sweep):
        ndcg = pool_queries([r.result.sweep[i]["ndcg"] for r in group])
        ent = pool_queries([r.result.sweep[i]["entity_p"] for r in group])
        curve.append({"weights": point["weights"],
                      "metrics": {X: _mean(ndcg), Y: _mean(ent), X + "_se": standard_error(ndcg)}})
    return curve


def _curve_xy(curve: Sequence[Mapping[str, Any]]) -> np.ndarray:
    return np.array([[p["metrics"][X], p["metrics"][Y]] for p in curve], dtype=np.float64).reshape(-1, 2)


def cross_fitted_points(group: Sequence[Run], layout: Any) -> dict[str, dict[str, Any]]:
    """Operating points chosen on one held-out year's sweep and scored on the other's.

    The weights of a named point used for the queries of year A come from the sweep over year
    B (different models, different queries), so no point is chosen on the queries it is
    scored on. Returns ``{name: {ndcg@10, entity_p@10, weights_used_on: {year: weights},
    per_query: {metric: {qid: v}}}}`` pooled over both years.
    """
    by_year: dict[str, list[Run]] = defaultdict(list)
    for r in group:
        by_year[r.heldout_year].append(r)
    if len(by_year) != 2:
        return {}
    curves = [seed_curve(rs) for rs in by_year.values()]
    picks = [compute_operating_points(c, layout) for c in curves]
    out: dict[str, dict[str, Any]] = {}
    for name in picks[0]:
        ndcg: dict[str, float] = {}
        ent: dict[str, float] = {}
        used: dict[str, dict[str, float]] = {}
        for year, rs, chooser in zip(by_year, by_year.values(), reversed(picks), strict=True):
            w = used[year] = chooser[name]["weights"]
            i = next(j for j, p in enumerate(rs[0].result.sweep) if all(
                math.isclose(p["weights"][k], w[k], abs_tol=1e-9) for k in p["weights"]))
            ndcg.update(pool_queries([r.result.sweep[i]["ndcg"] for r in rs]))
            ent.update(pool_queries([r.result.sweep[i]["entity_p"] for r in rs]))
        out[name] = {X: _mean(ndcg), Y: _mean(ent), "weights_used_on": used, "per_query": {X: ndcg, Y: ent}}
    return out


def per_seed_text(values: Sequence[float]) -> str:
    """``[0.6528, 0.645]`` -> ``"0.653 / 0.645"`` (one value per seed, in seed order)."""
    return " / ".join(f"{v:.3f}" for v in values)


def _seeds_text(seeds: Sequence[int | None]) -> str:
    s = [x for x in seeds if x is not None]
    return "deterministic (no training)" if not s else "seeds " + ", ".join(str(x) for x in s)


def build_report(ctx: Context, runs: Sequence[Run], out: Path, *, elapsed_s: float,
                 quick: bool = False) -> dict[str, Any]:
    """Write ``esp-bench.md``, ``esp-bench.json`` and the PNG plots under ``out``; return the results."""
    from esp_retrieval.training.evaluate import plots

    cfg = ctx.cfg
    out.mkdir(parents=True, exist_ok=True)
    n_classes = len(ctx.intent_classes)
    methods = list(cfg.methods)
    per_method: dict[str, dict[str, Any]] = {}
    for m in methods:
        groups = by_seed(runs, m)
        seeds = sorted(groups, key=lambda s: -1 if s is None else s)
        rows = {s: seed_metrics(groups[s], n_classes) for s in seeds}
        curves = {s: seed_curve(groups[s]) for s in seeds}
        per_method[m] = {"seeds": seeds, "per_seed": rows, "curves": curves, "groups": groups}

    # ---- hypervolume: ESP = its sweep's front; others = their single point ------------------
    ref = tuple(cfg.hypervolume_ref)
    for pm in per_method.values():
        hv = []
        for s in pm["seeds"]:
            curve = pm["curves"][s]
            pts = _curve_xy(curve) if curve else np.array([[pm["per_seed"][s][X], pm["per_seed"][s][Y]]])
            hv.append(hypervolume_2d(pts, ref=(ref[0], ref[1])))
        pm["hv"] = hv

    # ---- operating points (front method, mean curve over seeds) -----------------------------
    fm = cfg.front_method
    fpm = per_method[fm]
    front_layout = weight_names(fpm["groups"][fpm["seeds"][0]][0].layout, cfg.methods[fm].sparse)
    mean_curve = []
    for i, p in enumerate(fpm["curves"][fpm["seeds"][0]]):
        xs = [fpm["curves"][s][i]["metrics"][X] for s in fpm["seeds"]]
        ys = [fpm["curves"][s][i]["metrics"][Y] for s in fpm["seeds"]]
        se = [fpm["curves"][s][i]["metrics"][f"{X}_se"] for s in fpm["seeds"]]
        mean_curve.append({"weights": p["weights"],
                           "metrics": {X: float(np.mean(xs)), Y: float(np.mean(ys)),
                                       f"{X}_se": float(np.mean(se)),
                                       f"{X}_std": mean_std(xs)[1], f"{Y}_std": mean_std(ys)[1]}})
    context = (f"{cfg.methods[fm].label}; mean of {_seeds_text(fpm['seeds'])}, cross-year held-out "
               "TREC DL queries; chosen on the same sweep")
    op_points = compute_operating_points(mean_curve, front_layout, context=context) if mean_curve else {}
    cross = {s: cross_fitted_points(fpm["groups"][s], front_layout) for s in fpm["seeds"]}

    paired = paired_tests(per_method, cross, cfg)
    anchor = anchor_comparison(per_method, cfg)
    lever_rows = [compare(name, lv.method, lv.baseline, per_method=per_method, per_query=_per_query,
                          metrics=(X, Y))
                  for name, lv in cfg.levers.items() if lv.method in per_method and lv.baseline in per_method]

    # ---- diagnostics from the step logs ------------------------------------------------------
    logs: dict[str, list[StepLog]] = {}
    for r in runs:
        if r.log_path is not None and Path(r.log_path).is_file():
            logs.setdefault(r.method, []).append(read_log(Path(r.log_path)))
    diag = {m: summarize(lg) for m, lg in logs.items()}

    # ---- keyword clustering (front method vs zero-shot) --------------------------------------
    clustering = keyword_clustering(ctx, runs)

    # ---- plots -------------------------------------------------------------------------------
    label = {m: cfg.methods[m].label for m in methods}
    points = {}
    for m, pm in per_method.items():
        xs = [pm["per_seed"][s][X] for s in pm["seeds"]]
        ys = [pm["per_seed"][s][Y] for s in pm["seeds"]]
        hyb = cfg.methods[m].hybrid
        suffix = (" (cross-fitted alpha)" if hyb is not None and hyb.fusion == "minmax"
                  else " (default weights)" if any(pm["curves"].values()) else "")
        points[label[m] + suffix] = (
            mean_std(xs)[0], mean_std(ys)[0], mean_std(xs)[1], mean_std(ys)[1])
    sweeps, fronts = {}, {}
    for m, pm in per_method.items():
        if not any(pm["curves"].values()):
            continue
        xy = np.mean([_curve_xy(pm["curves"][s]) for s in pm["seeds"]], axis=0)
        sweeps[label[m]] = xy
        fronts[label[m]] = pareto_front(xy)
    plots.pareto_plot(out / "pareto.png", points, sweeps, fronts,
                      xlabel="semantic NDCG@10 (held-out TREC DL, cross-year)",
                      ylabel="entity precision@10 (DL-HARD gold entities)",
                      title=f"ESP serving-weight sweeps (mean over {_seeds_text(fpm['seeds'])}) vs baselines")
    _diagnostics_plot(out / "diagnostics.png", runs, cfg, label)
    if clustering["rows"]:
        _clustering_plot(out / "clustering.png", clustering)

    results: dict[str, Any] = {
        "protocol": protocol(ctx),
        "elapsed_s": elapsed_s,
        "methods": {m: {"label": label[m], "seeds": pm["seeds"], "per_seed": {str(s): pm["per_seed"][s]
                                                                              for s in pm["seeds"]},
                        "hypervolume": pm["hv"],
                        "curves": {str(s): c for s, c in pm["curves"].items() if c}}
                    for m, pm in per_method.items()},
        "operating_points": op_points,
        "operating_points_cross_fitted": {str(s): v for s, v in cross.items()},
        "paired_tests": paired,
        "anchor": anchor,
        "levers": lever_rows,
        "diagnostics": diag,
        "clustering": clustering,
        "data_conflict_tau": data_conflict(ctx),
        "timings": {f"{r.method}/{r.seed}/{r.heldout_year}/fold{r.intent_fold}": r.timings for r in runs},
    }
    results["protocol"]["seeds_done"] = sorted({r.seed for r in runs if r.seed is not None})
    atomic_write_text(out / RESULTS, json.dumps(results, indent=1, default=json_default) + "\n")
    atomic_write_text(out / REPORT, render(ctx, per_method, results, quick=quick))
    return results


def _per_query(pm: Mapping[str, Any], metric: str, seeds: Sequence[Any] | None = None) -> dict[str, float]:
    """A method's per-query metric at its default weights, each query averaged over ``seeds``
    (default: all of the method's)."""
    key = "ndcg" if metric == X else "entity_p"
    return mean_over_seeds([pool_queries([getattr(r.result, key) for r in pm["groups"][s]])
                            for s in (pm["seeds"] if seeds is None else seeds)])


def paired_tests(per_method: Mapping[str, Any], cross: Mapping[Any, Any], cfg: Any) -> list[dict[str, Any]]:
    """Paired tests over held-out queries (:mod:`esp_retrieval.training.evaluate.significance`): the front
    method's cross-fitted operating points against every zero-shot method, and its default
    weights against every other method."""
    fm = cfg.front_method
    fpm = per_method[fm]
    out: list[dict[str, Any]] = []
    zero = [m for m in per_method if not cfg.methods[m].trained]
    names = sorted({n for s in fpm["seeds"] for n in cross.get(s, {})})
    for name in names:
        for metric in (X, Y):
            a = mean_over_seeds([cross[s][name]["per_query"][metric]
                                 for s in fpm["seeds"] if name in cross[s]])
            for z in zero:
                t = paired_test(a, _per_query(per_method[z], metric))
                out.append({"a": f"{cfg.methods[fm].label}, {name} (cross-fitted)", "b": cfg.methods[z].label,
                            "metric": metric, **t.to_dict()})
    for m in per_method:
        if m == fm:
            continue
        for metric in (X, Y):
            t = paired_test(_per_query(fpm, metric), _per_query(per_method[m], metric))
            out.append({"a": f"{cfg.methods[fm].label}, default weights", "b": cfg.methods[m].label,
                        "metric": metric, **t.to_dict()})
    return out


def mean_curve_of(pm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A swept method's curve averaged point by point over its seeds (NDCG@10, entity P@10)."""
    seeds = pm["seeds"]
    first = pm["curves"][seeds[0]]
    return [{"weights": p["weights"],
             "metrics": {X: float(np.mean([pm["curves"][s][i]["metrics"][X] for s in seeds])),
                         Y: float(np.mean([pm["curves"][s][i]["metrics"][Y] for s in seeds]))}}
            for i, p in enumerate(first)]


def anchor_comparison(per_method: Mapping[str, Any], cfg: Any) -> list[dict[str, Any]]:
    """Each hybrid against the front method and every method with a sparse block: the hybrid's
    best-NDCG@10 sweep point, whether some point of the method's mean sweep is at least as good
    on both axes there (and, among those, the one with the best entity P@10), the cross-fitted
    alpha per year, and the two mean hypervolumes."""
    rivals = [m for m in per_method if m == cfg.front_method or cfg.methods[m].sparse is not None]
    out: list[dict[str, Any]] = []
    for h, pm in per_method.items():
        if cfg.methods[h].hybrid is None:
            continue
        curve = pm["curves"][pm["seeds"][0]]
        for m in rivals:
            mean_curve = mean_curve_of(per_method[m])
            esp = _curve_xy(mean_curve)
            row: dict[str, Any] = {
                "hybrid": h, "method": m,
                "hypervolume": float(np.mean(pm["hv"])),
                "method_hypervolume": float(np.mean(per_method[m]["hv"])),
                "alpha_used_on": {r.heldout_year: r.timings.get("alpha")
                                  for r in pm["groups"][pm["seeds"][0]]}}
            if curve:
                xy = _curve_xy(curve)
                best = int(np.lexsort((-xy[:, 1], -xy[:, 0]))[0])
                bx, by = float(xy[best, 0]), float(xy[best, 1])
                row["best"] = {"weights": curve[best]["weights"], X: bx, Y: by}
                at_least = [i for i in range(len(esp)) if esp[i, 0] >= bx and esp[i, 1] >= by]
                row["dominated_at_best"] = bool(at_least)
                if at_least:
                    i = max(at_least, key=lambda j: (esp[j, 1], esp[j, 0]))
                    row["method_point"] = {"weights": mean_curve[i]["weights"],
                                           X: float(esp[i, 0]), Y: float(esp[i, 1])}
            out.append(row)
    return out


def data_conflict(ctx: Context) -> dict[str, float]:
    from esp_retrieval.training.evaluate.retrieval import label_conflict

    return {y: label_conflict(ctx.bench, y) for y in ctx.bench.queries}


def protocol(ctx: Context) -> dict[str, Any]:
    b = ctx.bench
    return {
        "corpus_passages": len(b.pids),
        "queries": {y: len(q) for y, q in b.queries.items()},
        "entity_queries": {y: len(b.entity_qids(y)) for y in b.queries},
        "orcas_heldout": sum(len(t) for t in ctx.orcas_test.values()),
        "intent_folds": ctx.cfg.intent_folds,
        "orcas_total": len(ctx.orcas_texts),
        "intent_classes": ctx.intent_classes,
        "mimics_texts": len(ctx.mimics),
        "mimics_parents": len(set(ctx.mimics.labels)),
        "seeds": ctx.cfg.seeds,
        "heldout_years": ctx.cfg.heldout_years,
        "sweep_step": ctx.cfg.sweep_step,
        "hypervolume_ref": list(ctx.cfg.hypervolume_ref),
        "tiny_trunk": ctx.cfg.tiny_trunk,
        "training": ctx.cfg.training,
    }


def keyword_clustering(ctx: Context, runs: Sequence[Run]) -> dict[str, Any]:
    """Cluster held-out ORCAS-I queries and MIMICS refinements with the front method's models
    (every seed and held-out year) at each weight setting, and with the zero-shot trunk."""
    cfg = ctx.cfg
    specs = [ClusterSpec(c.method, c.params) for c in cfg.clustering.methods]
    if not specs:
        return {"rows": [], "settings": []}
    rows = []
    for r in runs:
        is_front = r.method == cfg.front_method
        zero = cfg.methods[r.method].zero_shot
        if not (is_front or zero) or r.result.orcas_emb is None:
            continue  # zero-shot keeps embeddings in its first run only: identical in every run
        test = r.orcas_test
        orcas_truth = [ctx.intent_classes[ctx.orcas_labels[i]] for i in test]
        layout = r.layout
        settings = cfg.clustering.weights if is_front else {"trunk": {layout.names[0]: 1.0}}
        for sname, w in settings.items():
            for spec in specs:
                o = cluster_scores(r.result.orcas_emb[test], orcas_truth, layout, w, spec)
                mm = (cluster_scores(r.result.mimics_emb, ctx.mimics.labels, layout, w, spec)
                      if r.result.mimics_emb is not None and len(ctx.mimics) else {})
                rows.append({"method": r.method, "seed": r.seed, "heldout_year": r.heldout_year,
                             "setting": sname, "weights": w, "cluster": spec.label,
                             "orcas": o, "mimics": mm})
    return {"rows": rows, "settings": list(cfg.clustering.weights)}


def _diagnostics_plot(path: Path, runs: Sequence[Run], cfg: Any, label: Mapping[str, str]) -> None:
    from esp_retrieval.training.evaluate import plots

    first: dict[str, StepLog] = {}
    for r in runs:
        if r.log_path is not None and r.method not in first and Path(r.log_path).is_file():
            first[r.method] = read_log(Path(r.log_path))
    window = 20
    first = {m: lg for m, lg in first.items() if lg.steps.size}  # a run of 0 steps logs nothing
    # the gradient cosines exist only where some parameters are shared by two objectives
    cos = {label[m]: {k: (lg.steps, rolling_mean(v, window)) for k, v in lg.cosine.items()}
           for m, lg in first.items() if lg.cosine}
    proj = {label[m]: (lg.steps, rolling_mean(np.mean(np.stack(list(lg.projected.values())), axis=0), window))
            for m, lg in first.items() if cfg.training_dict(m).get("surgery", {}).get("name") == "pcgrad"
            and lg.projected}
    ratio = {label[m]: (lg.steps, rolling_mean(np.where(np.isfinite(lg.norm_ratio), lg.norm_ratio, np.nan),
                                               window)) for m, lg in first.items()}
    lam = {label[m]: {k: (lg.steps, v) for k, v in lg.lam.items()}
           for m, lg in first.items() if cfg.training_dict(m).get("weighting", {}).get("name") == "dwa"}
    seed = cfg.seeds[0]
    year = cfg.heldout_years[0]
    plots.diagnostics_plot(path, cos, proj, ratio, lam,
                           title=f"training diagnostics, seed {seed}, held-out {year} "
                                 f"(rolling mean over {window} steps)")


def _clustering_plot(path: Path, clustering: Mapping[str, Any]) -> None:
    from esp_retrieval.training.evaluate import plots

    settings = clustering["settings"]
    agg: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for row in clustering["rows"]:
        if row["setting"] not in settings:
            continue
        for ds, metric in (("orcas", "purity_multi"), ("mimics", "nmi"), ("mimics", "ari")):
            if row[ds]:
                agg[(ds, metric, row["cluster"], row["setting"])].append(row[ds][metric])
    series: dict[str, dict[str, list[float]]] = {}
    for ds, metric, title in (("orcas", "purity_multi", "ORCAS-I held-out: intent purity, clusters of 2+"),
                              ("mimics", "nmi", "MIMICS: NMI vs parent query"),
                              ("mimics", "ari", "MIMICS: ARI vs parent query")):
        lines: dict[str, list[float]] = {}
        for c in sorted({k[2] for k in agg}):
            finite = [[v for v in agg.get((ds, metric, c, s), []) if math.isfinite(v)] for s in settings]
            lines[c] = [float(np.mean(v)) if v else math.nan for v in finite]  # as the table: NaN left out
        series[title] = lines
    plots.clustering_plot(path, settings, series,
                          title="keyword clustering vs serving weights (front method)")


# ------------------------------------------------------------------------------- markdown


def render(ctx: Context, per_method: Mapping[str, Any], results: Mapping[str, Any], *, quick: bool) -> str:
    cfg = ctx.cfg
    p = results["protocol"]
    lines: list[str] = []
    add = lines.append
    add("# ESP benchmark: the ablation on real data")
    add("")
    if quick:
        add("> **QUICK MODE** — tiny random BERT and a data slice: these numbers check the pipeline, "
            "they say nothing about the methods.")
        add("")
    add(f"Generated by `esp eval` in {results['elapsed_s'] / 60:.1f} min on {platform.machine()} "
        f"({os.cpu_count()} CPUs), training {_seeds_text(p['seeds_done'])}"
        + ("" if p["seeds_done"] == list(cfg.seeds) else f" (PARTIAL: the config asks for seeds {cfg.seeds})")
        + ". "
        "Frozen-trunk training: the all-MiniLM-L6-v2 trunk is frozen, its mean-pooled features are "
        "computed once and cached; each method trains its heads (and the shared residual adapter where "
        "one is configured; a query-tower row, trunk mode `query_top:N`, also trains the trunk's top N "
        "layers on the query side, the passages keeping the frozen features).")
    add("")
    tim = [v for k, v in results["timings"].items() if "features_s" in v]
    if tim:
        per_run = [v.get("train_total_s", math.nan) + v.get("eval_s", 0.0) for v in tim]
        add(f"Timing: trunk features {tim[0]['features_s']:.0f} s in the first run (a few seconds when "
            f"the cache already held them, e.g. from `esp train` with the same data), then "
            f"{np.median(per_run):.0f} s median per training + evaluation run ({len(tim)} runs).")
        add("")
    add("## Protocol")
    add("")
    sl = cfg.data_slice
    what = ("the judged passages of the TREC DL 2019+2020 pool (a condensed list)"
            if sl is not None and sl.corpus == "judged" else "the TREC DL 2019+2020 passage pool")
    add(f"- Corpus: {what}, {p['corpus_passages']:,} passages; every "
        "ranking is the service's engine (`esp_retrieval.subspace.engine`, numpy backend: block-normalised "
        "embeddings, the exact float64 top k, ties to the lower row).")
    sched = cfg.schedule()
    add(f"- Held-out queries only, cross-year: each seed trains {len(sched)} models per method, each "
        f"holding out one TREC DL year ({', '.join(cfg.heldout_years)}, alternating) and never training "
        "on it; a query's score is the mean over the models of its seed that held it out "
        f"({sum(p['queries'].values())} queries for NDCG, {sum(p['entity_queries'].values())} with gold "
        "entities for entity precision).")
    add("- Semantic: NDCG@10 with the NIST graded qrels, trec_eval `ndcg_cut_10` conventions (linear "
        "gain = grade, ideal ranking from all judged passages, including those outside the pool).")
    add("- Entity: precision@10 = share of the top 10 passages mentioning any DL-HARD gold entity of "
        "the query (surface form or Wikipedia title, whole word, case-insensitive).")
    if cfg.intent_folds is not None:
        split = (f"stratified {cfg.intent_folds}-fold cross-validation (folds fixed by a hash of the qid, "
                 "the same for every method and seed): each of the runs above holds out one fold, so "
                 f"all {p['orcas_heldout']} of {p['orcas_total']} queries get one out-of-fold prediction "
                 "per seed, and macro-F1 is computed over those pooled predictions")
    else:
        split = (f"the trainer holds out {p['orcas_heldout'] // max(1, len(sched))} of {p['orcas_total']} "
                 "queries (qid hash, ~20%, the same for every run)")
    add(f"- Intent: ORCAS-I, classes {', '.join(p['intent_classes'])}; {split}. Macro-F1 of the intent "
        "head; agreement@10 = share of each held-out query's 10 nearest other ORCAS-I queries (default "
        "serving weights) with its own class.")
    add("- Conflict proxy: Kendall tau-b between the semantic-block and entity-block rankings of each "
        "held-out query's candidate pool (epsilon = 1 - tau; ESP only, a single-head model has one "
        "ranking); effective rank = exp(entropy of normalised singular values) of 5,000 corpus "
        "embeddings (seeded sample).")
    add(f"- Hypervolume in (NDCG@10, entity P@10) with reference point {tuple(cfg.hypervolume_ref)}: "
        f"ESP methods use the front of their serving-weight sweep (simplex grid, step {cfg.sweep_step}); "
        "other methods their single point.")
    add("- Seeds: every trained number is mean ± sample std over the seeds listed; zero-shot is "
        "deterministic.")
    add("")

    # ---- main table
    add("## Main table")
    add("")
    add(f"Mean ± std over {_seeds_text(p['seeds_done'])}; ESP rows at each method's default serving "
        "weights (its objectives' `default_weight` and its sparse block's, all 1 unless the config says "
        "otherwise), plus the operating points below.")
    add("")
    header = ["method", "NDCG@10", "entity P@10", "intent macro-F1", "intent agreement@10",
              "hypervolume", "seeds"]
    rows = []
    for m, pm in per_method.items():
        ps = [pm["per_seed"][s] for s in pm["seeds"]]
        rows.append([cfg.methods[m].label, fmt([r[X] for r in ps]), fmt([r[Y] for r in ps]),
                     fmt([r["intent_f1"] for r in ps]), fmt([r["agreement@10"] for r in ps]),
                     fmt(pm["hv"]), _seeds_text(pm["seeds"])])
    add(markdown_table(header, rows))
    add("")
    add("Zero-shot intent F1 is a nearest-class-centroid classifier on the frozen trunk (fit on each "
        "run's training ORCAS-I queries), so it is a no-training reference, not a trained head.")
    add("")
    add("![Pareto](pareto.png)")
    add("")

    # ---- sweep table (ESP front method), like the paper's w_e row
    fm = cfg.front_method
    curves = per_method[fm]["curves"]
    if any(curves.values()):
        add(f"## Serving-weight sweep of {cfg.methods[fm].label}")
        add("")
        first = curves[per_method[fm]["seeds"][0]]
        names = [n for n in first[0]["weights"] if n != "intent"]
        add("Every checkpoint of every run is swept; only the serving weights change. The points of "
            "the simplex grid with w_intent = 0, one column per other weight (they sum to 1); mean ± "
            f"std over {_seeds_text(per_method[fm]['seeds'])}.")
        add("")
        srows = []
        for i, pt in enumerate(first):
            w = pt["weights"]
            if w.get("intent", 0.0) != 0.0:
                continue
            xs = [curves[s][i]["metrics"][X] for s in per_method[fm]["seeds"]]
            ys = [curves[s][i]["metrics"][Y] for s in per_method[fm]["seeds"]]
            srows.append([f"{w.get(n, 0.0):.1f}" for n in names] + [fmt(xs), fmt(ys)])
        add(markdown_table([f"w_{n}" for n in names] + ["NDCG@10", "entity P@10"], srows))
        add("")

    # ---- operating points
    ops = results["operating_points"]
    if ops:
        add("## Operating points")
        add("")
        add(f"Picked on the mean sweep of {cfg.methods[fm].label} (these are what "
            "`write_operating_points` puts into a bundle manifest): `balanced` and `entity_first` on its "
            "Pareto front, `semantic_first` by the one-standard-error rule (the most semantic-weighted "
            "point within one SE of the best NDCG@10, `training.evaluate.operating_points`). Because they "
            "are chosen on the same held-out queries they are scored on, the *cross-fitted* columns choose "
            "each point's weights on the other held-out year's sweep (other model, other queries) and are "
            "the honest estimate; the last column lists the weights each seed used per scored year.")
        add("")
        orows = []
        front_names = list(next(iter(ops.values()))["weights"])
        for name, op in ops.items():
            cf = [results["operating_points_cross_fitted"][str(s)].get(name, {}) for s in
                  per_method[fm]["seeds"]]
            w = ", ".join(f"{k}={v:.1f}" for k, v in op["weights"].items())
            used = "; ".join(
                f"s{s} " + " ".join(f"{y}:" + "/".join(f"{v:.1f}" for v in wy.values())
                                    for y, wy in c.get("weights_used_on", {}).items())
                for s, c in zip(per_method[fm]["seeds"], cf, strict=True))
            orows.append([name, w, f"{op['metrics'][X]:.3f}", f"{op['metrics'][Y]:.3f}",
                          fmt([c.get(X, math.nan) for c in cf]), fmt([c.get(Y, math.nan) for c in cf]),
                          per_seed_text([c.get(X, math.nan) for c in cf]), used])
        add(markdown_table(["name", "weights", "NDCG@10", "entity P@10", "cross-fitted NDCG@10",
                            "cross-fitted entity P@10", "cross-fitted NDCG@10 per seed",
                            f"weights used ({'/'.join(front_names)})"], orows))
        add("")

    # ---- paired tests and the hypervolume margin
    if results.get("paired_tests"):
        add("## Paired tests over queries")
        add("")
        add("Each held-out query's value averaged over seeds, then paired between the two methods: mean "
            "difference (A - B), two-sided paired t-test and Wilcoxon signed-rank p-values "
            "(`esp_retrieval.training.evaluate.significance`).")
        add("")
        prow = [[t["a"], t["b"], t["metric"], str(t["n"]), f"{t['mean_a']:.3f}", f"{t['mean_b']:.3f}",
                 f"{t['diff']:+.3f}", f"{t['p_ttest']:.2g}", f"{t['p_wilcoxon']:.2g}"]
                for t in results["paired_tests"]]
        add(markdown_table(["A", "B", "metric", "queries", "A", "B", "A - B", "p (t-test)", "p (Wilcoxon)"],
                           prow))
        add("")
        hv_f = per_method[fm]["hv"]
        lines_hv = []
        for m, pm in per_method.items():
            if m == fm:
                continue
            sd = max(mean_std(hv_f)[1] if len(hv_f) > 1 else 0.0,
                     mean_std(pm["hv"])[1] if len(pm["hv"]) > 1 else 0.0)
            gap = float(np.mean(hv_f) - np.mean(pm["hv"]))
            ratio = f"{gap / sd:.1f} std" if sd > 0 else "no seed spread"
            lines_hv.append(f"{cfg.methods[m].label}: {gap:+.4f} ({ratio})")
        add(f"Hypervolume of the {cfg.methods[fm].label} front minus each method's, in units of the larger "
            "seed std of the two: " + "; ".join(lines_hv) + ".")
        add("")

    lines.extend(_anchor_section(cfg, per_method, results))
    lines.extend(_levers_section(cfg, results))

    # ---- conflict and geometry
    add("## Conflict proxy and effective rank")
    add("")
    dc = results["data_conflict_tau"]
    add("Data-level conflict (no model): mean Kendall tau-b between the NIST grade and \"mentions a "
        "gold entity\" over each query's judged pool passages: "
        + ", ".join(f"{y}: tau = {v:.3f} (epsilon = {1 - v:.3f})" for y, v in dc.items() if math.isfinite(v))
        + ".")
    add("")
    blocks = sorted({k for pm in per_method.values() for s in pm["seeds"] for k in pm["per_seed"][s]
                     if k.startswith("erank[")})
    crow = []
    for m, pm in per_method.items():
        ps = [pm["per_seed"][s] for s in pm["seeds"]]
        tau = [r["tau_sem_ent"] for r in ps]
        eps = [1 - t for t in tau if math.isfinite(t)]
        crow.append([cfg.methods[m].label, fmt(tau), fmt(eps)] + [fmt([r.get(b, math.nan) for r in ps], 1)
                                                                 for b in blocks])
    eheads = [b.replace("erank", "eff. rank") for b in blocks]
    add(markdown_table(["method", "tau(sem, ent)", "epsilon", *eheads], crow))
    add("")

    # ---- diagnostics
    diag = results["diagnostics"]
    if diag:
        add("## Training diagnostics")
        add("")
        add("From the trainer's JSONL step logs, every run of every seed: mean cosine between the "
            "weighted task gradients on the shared parameters, share of steps where it is negative, "
            "share of steps where PCGrad projected the pair (0 without PCGrad), median ratio of the "
            "largest to the smallest task-gradient norm, and the final DWA/static lambdas.")
        add("")
        keys = sorted({k for d in diag.values() for k in d})
        pairs = sorted({k[4:-1] for k in keys if k.startswith("cos[")})
        lam_keys = sorted(k for k in keys if k.startswith("lambda_final["))
        drows = []
        for m, d in diag.items():
            row = [cfg.methods[m].label]
            for pr in pairs:
                row.append(f"{d.get(f'cos[{pr}]', math.nan):+.3f} / {d.get(f'neg[{pr}]', math.nan):.2f} / "
                           f"{d.get(f'proj[{pr}]', math.nan):.2f}")
            row.append(f"{d.get('norm_ratio_median', math.nan):.1f}")
            row.append(", ".join(f"{k[13:-1]}={d[k]:.2f}" for k in lam_keys if k in d))
            drows.append(row)
        pheads = [f"{pr}: cos / neg / proj" for pr in pairs]
        add(markdown_table(["method", *pheads, "norm ratio", "final lambdas"], drows))
        add("")
        add("![diagnostics](diagnostics.png)")
        add("")

    # ---- clustering
    cl = results["clustering"]
    if cl["rows"]:
        add("## Keyword clustering")
        add("")
        trained_on = any((o.get("data_params") or {}).get("mimics") for o in cfg.training["objectives"])
        mimics_note = ("MIMICS pairs are semantic training data, so the MIMICS scores are in-sample"
                       if trained_on else "MIMICS is not used in training here")
        add(f"Each model's held-out ORCAS-I queries ({p['orcas_heldout']} over all folds) and "
            f"{p['mimics_texts']} MIMICS \"query + "
            f"refinement\" texts of {p['mimics_parents']} parent queries ({mimics_note}), "
            "embedded by the front method's models (every run of every seed) and by the "
            "zero-shot trunk, clustered by `subspace.clustering` at each serving-weight setting. Intent "
            "purity leaves HDBSCAN noise out (its share is the noise column); a singleton cluster is "
            "pure by construction, so purity is also given over clusters of two or more queries, with "
            "the share of queries left in singletons (the plot shows that purity). NMI / ARI count "
            "noise points as singletons.")
        add("")
        agg: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in cl["rows"]:
            agg[(cfg.methods[r["method"]].label, r["setting"], r["cluster"])].append(r)
        krows = []
        for (mlabel, setting, cluster), rs in agg.items():
            o = [r["orcas"] for r in rs]
            mm = [r["mimics"] for r in rs if r["mimics"]]
            seeds = sorted({r["seed"] for r in rs if r["seed"] is not None})
            krows.append([mlabel, setting, cluster,
                          fmt([x["purity"] for x in o]), fmt([x["purity_multi"] for x in o]),
                          fmt([x["singletons"] for x in o], 2), fmt([x["n_clusters"] for x in o], 0),
                          fmt([x["noise"] for x in o], 2),
                          fmt([x["nmi"] for x in mm]), fmt([x["ari"] for x in mm]),
                          fmt([x["n_clusters"] for x in mm], 0), _seeds_text(seeds) + f" ({len(rs)} models)"])
        add(markdown_table(["model", "weights", "method", "ORCAS intent purity", "purity, clusters of 2+",
                            "in singletons", "ORCAS clusters", "noise",
                            "MIMICS NMI", "MIMICS ARI", "MIMICS clusters", "runs"], krows))
        add("")
        add("![clustering](clustering.png)")
        add("")
    add("## Reproduce")
    add("")
    add("`esp eval --config configs/eval.yaml --out reports/` (all numbers above; the machine-readable "
        "results are in `esp-bench.json`). `esp eval --quick` runs the same pipeline on a tiny random "
        "BERT and a data slice.")
    add("")
    return "\n".join(lines)


def _levers_section(cfg: Any, results: Mapping[str, Any]) -> list[str]:
    """One row per lever (:mod:`esp_retrieval.training.evaluate.levers`): with it minus without it."""
    rows = results.get("levers") or []
    if not rows:
        return []
    lines = ["## Levers: each one on and off", "",
             "Each lever's method against the same method without it, on the seeds both were trained "
             "with, at default weights: the paired differences over held-out queries (t-test p), the "
             "intent macro-F1 and hypervolume differences (means over those seeds), and the verdict: "
             f"a retrieval metric counts as moved when its paired p < {ALPHA:g}. The intent F1 difference "
             "is not tested (macro-F1 over pooled predictions has no per-query pairing) and does not enter "
             "the verdict.", ""]
    table = []
    for r in rows:
        t = r["tests"]
        table.append([r["lever"], cfg.methods[r["method"]].label, cfg.methods[r["baseline"]].label,
                      _seeds_text(r["seeds"]) if r["seeds"] else "deterministic",
                      f"{t[X]['diff']:+.3f} (p {t[X]['p_ttest']:.2g})",
                      f"{t[Y]['diff']:+.3f} (p {t[Y]['p_ttest']:.2g})",
                      "—" if not math.isfinite(r["intent_f1_diff"]) else f"{r['intent_f1_diff']:+.3f}",
                      f"{r['hypervolume_diff']:+.4f}", r["verdict"]])
    lines.append(markdown_table(["lever", "with it", "without it", "seeds", "Δ NDCG@10", "Δ entity P@10",
                                 "Δ intent F1", "Δ hypervolume", "verdict"], table))
    lines.append("")
    return lines


def _anchor_section(cfg: Any, per_method: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    """The comparison a user makes before adopting ESP: BM25 + zero-shot hybrids (no training)."""
    anchor = results.get("anchor") or []
    if not anchor:
        return []
    lines = ["## The anchor: BM25 + zero-shot hybrids", ""]
    lines.append(
        "What users of Weaviate, Qdrant, Milvus, Vespa or Elasticsearch run without training: BM25 (`bm25s`, "
        "Lucene variant) and the zero-shot trunk, fused per query (`training.evaluate.hybrid`). A min-max "
        "hybrid's row uses the BM25 weight alpha with the best NDCG@10 on the other held-out year "
        "(cross-fitted); its whole alpha sweep is its front, in the hypervolume and the plot. "
        "\"Best point\" is the hybrid's best-NDCG@10 alpha on all queries; the next column is the point "
        "of the method's mean sweep that is at least as good on both axes there, if one exists (both "
        "chosen on the queries they are scored on).")
    lines.append("")
    rows = []
    for a in anchor:
        spec = cfg.methods[a["hybrid"]].hybrid
        params = f"{spec.fusion}, k1 {spec.k1}, b {spec.b}"
        if spec.fusion == "rrf":
            params += f", RRF k {spec.rrf_k:g}"
        alpha = ", ".join(f"{y}: {v:.2f}" for y, v in a["alpha_used_on"].items()
                          if v is not None and math.isfinite(v)) or "-"
        best = a.get("best")
        best_txt = (f"alpha {best['weights'].get('bm25', math.nan):.2f}: {best[X]:.3f} / {best[Y]:.3f}"
                    if best else "-")
        pt = a.get("method_point")
        pt_txt = ("none" if best and not pt else "-" if not best else
                  ", ".join(f"{k}={v:.1f}" for k, v in pt["weights"].items())
                  + f": {pt[X]:.3f} / {pt[Y]:.3f}")
        rows.append([cfg.methods[a["hybrid"]].label, params, alpha, best_txt, cfg.methods[a["method"]].label,
                     pt_txt, f"{a['method_hypervolume'] - a['hypervolume']:+.4f}"])
    lines.append(markdown_table(["hybrid", "fusion", "cross-fitted alpha (scored year: alpha)",
                                 "best point (NDCG@10 / entity P@10)", "ESP method",
                                 "its point at least as good there", "its hypervolume - hybrid's"], rows))
    lines.append("")
    return lines
