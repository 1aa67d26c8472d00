"""Run the ablation: train every method per seed and held-out year, evaluate, aggregate.

Protocol (written into the report):

- Cross-year hold-out: a run trained with ``split.heldout_year = dl20`` is scored on the DL20
  queries, one trained with ``dl19`` on DL19; per seed the two runs' per-query scores are
  pooled, so every one of the 97 (NDCG) / 94 (entity) queries is scored by a model that never
  trained on it.
- Intent: stratified k-fold over ORCAS-I (``intent_folds``): each run of a seed holds out one
  fold (and one TREC DL year, alternating, see :meth:`EvalConfig.schedule`), so macro-F1 and
  agreement@10 are computed on pooled out-of-fold predictions of all ORCAS-I queries. Without
  folds the trainer's fixed ~20% hash hold-out is used.
- The zero-shot trunk needs no training; per fold its intent classifier is the nearest class
  centroid of the fold's training ORCAS-I queries.
- A hybrid (BM25 + the zero-shot trunk, :mod:`training.evaluate.hybrid`) needs no training either;
  its row uses the fusion weight chosen on the other held-out year.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.training.evaluate.benchmark import DLBench, LabelledTexts, load_dl, load_mimics_clusters
from esp_retrieval.training.evaluate.config import EvalConfig
from esp_retrieval.training.evaluate.evaluator import (
    Features,
    ModelEmbedder,
    ModelEval,
    ZeroShot,
    evaluate_model,
)
from esp_retrieval.training.evaluate.retrieval import simplex_grid

log = logging.getLogger(__name__)

TREC = "trec-dl-2019-2020-passage"


@dataclass
class Run:
    """One model: a trained (method, seed, held-out year) or the zero-shot trunk per year."""

    method: str
    seed: int | None
    heldout_year: str
    intent_fold: int | None
    orcas_test: list[int]  # rows of the ORCAS-I queries this run held out
    result: ModelEval
    log_path: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    layout: Any = None  # esp_retrieval.subspace.layout.SubspaceLayout of the model's embeddings


@dataclass
class Context:
    """Everything the runs share: data, features, the intent split, the trunk."""

    cfg: EvalConfig
    data_dir: Path
    work_dir: Path
    bench: DLBench
    orcas_texts: list[str]
    orcas_labels: list[int]
    intent_classes: list[str]
    orcas_test: dict[int | None, list[int]]  # intent fold (None: hash hold-out) -> held-out rows
    mimics: LabelledTexts
    trunk_path: str | None
    features: Features | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: BM25 parameters -> year -> (nq, N) scores, shared by the hybrids
    bm25: dict[tuple[Any, ...], dict[str, np.ndarray]] = field(default_factory=dict)
    #: sparse block spec -> year -> (nq, N) block scores, shared by the methods that carry it
    sparse: dict[tuple[Any, ...], dict[str, np.ndarray]] = field(default_factory=dict)


def intent_config(cfg: EvalConfig) -> dict[str, Any]:
    obj = next((o for o in cfg.training["objectives"] if o.get("data") == "intent"), None)
    if obj is None:
        raise ValueError("training.objectives needs an objective with data: intent for the intent metrics")
    return dict(obj.get("data_params") or {})


def prepare(cfg: EvalConfig, data_dir: Path, work_dir: Path) -> Context:
    """Load the data (sliced first in quick mode), the ORCAS-I hold-out and, in quick mode, build
    the tiny trunk."""
    from esp_retrieval.training.data.objectives import DataContext, Split, build_objective, stratified_folds
    from esp_retrieval.training.data.orcas import load_orcas

    work_dir.mkdir(parents=True, exist_ok=True)
    if cfg.data_slice is not None:
        from esp_retrieval.training.evaluate.slice import make_data_slice

        data_dir = make_data_slice(data_dir, work_dir / "data", cfg.data_slice)
    bench = load_dl(data_dir / TREC)
    classes = intent_config(cfg).get("classes", "3")
    orcas = load_orcas(data_dir, classes)
    split = cfg.training.get("split", {})
    ctx = DataContext(data_dir, Split(intent_heldout_fraction=split.get("intent_heldout_fraction", 0.2)))
    orcas_test: dict[int | None, list[int]] = {}
    if cfg.intent_folds is None:
        held = set(build_objective("intent", ctx, classes=classes).heldout.texts)
        orcas_test[None] = [i for i, t in enumerate(orcas.texts) if t in held]
    else:
        folds = stratified_folds(list(orcas.qids), list(orcas.labels), cfg.intent_folds)
        for f in range(cfg.intent_folds):
            orcas_test[f] = [i for i, g in enumerate(folds) if g == f]
    mimics = load_mimics_clusters(data_dir, cfg.clustering.mimics_parents)
    trunk_path = None
    if cfg.tiny_trunk:
        from esp_retrieval.training.tiny import save_tiny_bert

        trunk_path = str(save_tiny_bert(work_dir / "tiny-bert", bench.texts + orcas.texts, seed=0))
    return Context(cfg, data_dir, work_dir, bench, list(orcas.texts), list(orcas.labels), list(orcas.classes),
                   orcas_test, mimics, trunk_path)


def _query_texts(ctx: Context) -> tuple[list[str], list[str]]:
    """The ids and texts of every TREC DL query, year by year."""
    qids = [q for y in ctx.bench.queries for q in ctx.bench.queries[y]]
    return qids, [ctx.bench.queries[y][q] for y in ctx.bench.queries for q in ctx.bench.queries[y]]


def _features(ctx: Context, trainer: Any) -> Features:
    """Pooled features of everything evaluated, from the trainer's store (frozen trunk) and the
    feature cache for the texts the trainer does not embed (all DL queries, MIMICS texts).

    A query-tower run (trunk mode ``query_top:N``) contributes its frozen features only: the
    untrained tower for the texts its store lacks (its trunk has trained layers by now)."""
    from esp_retrieval.training.features import pooled_features
    from esp_retrieval.training.query_tower import TowerStore

    tower = trainer.store if isinstance(trainer.store, TowerStore) else None
    store = tower.frozen if tower is not None else trainer.store
    if store is None:
        raise ValueError("evaluation needs cached trunk features (trunk mode frozen or query_top:N)")
    qids, qtexts = _query_texts(ctx)
    needed = qtexts + ctx.orcas_texts + ctx.bench.texts + ctx.mimics.texts
    missing = sorted({t for t in needed if t not in store.row})
    extra: dict[str, np.ndarray] = {}
    if missing and tower is not None:
        extra = dict(zip(missing, tower.query_features_np(missing, trained=False), strict=True))
    elif missing:
        feats = pooled_features(trainer.model.trunk, missing, trainer.config.trunk.features_cache,
                                batch_size=trainer.config.trunk.encode_batch_size, desc="eval-only texts")
        extra = dict(zip(missing, trainer.model.with_lexical(missing, feats), strict=True))
    width = int(store.feats.shape[1])

    def get(texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, width), dtype=np.float32)
        known = [t for t in texts if t in store.row]
        out = np.zeros((len(texts), width), dtype=np.float32)
        if known:
            vals = store(known).cpu().numpy()
            lookup = dict(zip(known, vals, strict=True))
        else:
            lookup = {}
        for i, t in enumerate(texts):
            out[i] = lookup[t] if t in lookup else extra[t]
        return out

    q = get(qtexts)
    return Features(corpus=get(ctx.bench.texts), queries=dict(zip(qids, q, strict=True)),
                    orcas=get(ctx.orcas_texts), mimics=get(ctx.mimics.texts))


def train_and_evaluate(ctx: Context, method: str, seed: int, heldout_year: str,
                       intent_fold: int | None = None) -> Run:
    """Train one run of ``method`` and evaluate it on its held-out year and intent fold."""
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer

    cfg = ctx.cfg
    d = cfg.training_dict(method, seed=seed, heldout_year=heldout_year, intent_fold=intent_fold)
    d["data_dir"] = str(ctx.data_dir)
    d["eval"] = {**d.get("eval", {}), "enabled": False}  # evaluate_model below scores the run
    if not d.get("trunk", {}).get("features_cache"):
        # Without a cache every run would re-encode the same texts: keep one in the work dir.
        d.setdefault("trunk", {})["features_cache"] = str(ctx.work_dir / "features")
    from esp_retrieval.training.config import TrainConfig

    tc = TrainConfig(**d)
    t0 = time.perf_counter()
    trainer = Trainer(build_run(tc, trunk_path=ctx.trunk_path), tc, progress=False)
    fold = "" if intent_fold is None else f"-fold{intent_fold}"
    run_dir = ctx.work_dir / "runs" / method / f"seed{seed}-heldout-{heldout_year}{fold}"
    result = trainer.run(run_dir)
    t1 = time.perf_counter()
    if ctx.features is None:
        ctx.features = _features(ctx, trainer)
        ctx.timings["hidden_size"] = float(trainer.model.trunk.hidden_size)
    features = _tower_features(ctx, trainer, ctx.features)
    layout = result.model.layout
    esp = tc.architecture == "esp"
    spec = cfg.methods[method].sparse
    sparse = {spec.name: sparse_scores(ctx, spec, tc)[heldout_year]} if spec is not None else None
    defaults = {spec.name: spec.default_weight} if spec is not None else {}
    sweep = simplex_grid([*layout.names, *(sparse or {})], cfg.sweep_step) if esp else []
    test = ctx.orcas_test[intent_fold]
    ev = evaluate_model(
        ModelEmbedder(result.model), features, ctx.bench, eval_year=heldout_year,
        orcas_labels=ctx.orcas_labels, orcas_test=test, sweep=sweep,
        keep_embeddings=method == cfg.front_method, erank_rows=5000, sparse=sparse, sparse_defaults=defaults,
    )
    timings = {**result.timings, "train_total_s": t1 - t0, "eval_s": time.perf_counter() - t1}
    log.info("%s seed %d held-out %s%s: NDCG@10 %.3f, entity P@10 %.3f (train %.1fs, eval %.1fs)",
             method, seed, heldout_year, fold, np.mean(list(ev.ndcg.values())),
             np.mean(list(ev.entity_p.values())), timings["train_total_s"], timings["eval_s"])
    return Run(method, seed, heldout_year, intent_fold, test, ev, result.log_path, timings, layout)


def _tower_features(ctx: Context, trainer: Any, frozen: Features) -> Features:
    """A query-tower run's features: the passages' frozen ones, every query (TREC DL, ORCAS-I,
    MIMICS) through its trained tower; any other run's: ``frozen`` as they are."""
    from esp_retrieval.training.query_tower import TowerStore

    store = trainer.store
    if not isinstance(store, TowerStore):
        return frozen
    qids, qtexts = _query_texts(ctx)
    queries = store.query_features_np(qtexts)
    mimics = store.query_features_np(ctx.mimics.texts) if ctx.mimics.texts else frozen.mimics
    return Features(corpus=frozen.corpus, queries=dict(zip(qids, queries, strict=True)),
                    orcas=store.query_features_np(ctx.orcas_texts), mimics=mimics)


def sparse_scores(ctx: Context, spec: Any, tc: Any) -> dict[str, np.ndarray]:
    """Year -> ``(nq, N)`` scores of the sparse block of ``spec`` (built once per context; one
    with learned term weights once per held-out year, fitted on the run ``tc``'s training queries)."""
    learned = spec.term_weights is not None
    key = (spec.k1, spec.b, spec.stopwords, spec.term_weights.model_dump_json() if learned else None,
           tc.split.heldout_year if learned else None)
    if key not in ctx.sparse:
        from esp_retrieval.training.run import data_context
        from esp_retrieval.training.sparse_lexical import build_block

        block = build_block(spec, ctx.bench.pids, ctx.bench.texts, data_context(tc) if learned else None)
        ctx.sparse[key] = {y: block.scores(block.encode(list(q.values())))
                           for y, q in ctx.bench.queries.items() if not learned or y == key[-1]}
    return ctx.sparse[key]


def zero_shot_runs(ctx: Context, method: str) -> list[Run]:
    """The untrained trunk, scored on each held-out year (needs the features of a first run)."""
    if ctx.features is None:
        raise RuntimeError("zero-shot evaluation needs the features loaded by a trained run first")
    f = ctx.features
    runs: list[Run] = []
    for year, fold in ctx.cfg.schedule():
        t0 = time.perf_counter()
        test = ctx.orcas_test[fold]
        held = set(test)
        train_rows = [i for i in range(len(ctx.orcas_texts)) if i not in held]
        zs = ZeroShot(hidden=int(ctx.timings["hidden_size"])).fit_centroids(
            f.orcas[train_rows], [ctx.orcas_labels[i] for i in train_rows], len(ctx.intent_classes))
        ev = evaluate_model(zs, f, ctx.bench, eval_year=year, orcas_labels=ctx.orcas_labels,
                            orcas_test=test, keep_embeddings=not runs, erank_rows=5000)
        runs.append(Run(method, None, year, fold, test, ev, None, {"eval_s": time.perf_counter() - t0},
                        zs.layout))
    return runs


def hybrid_runs(ctx: Context, method: str) -> list[Run]:
    """An untrained BM25 + zero-shot hybrid, one run per held-out year (needs the features of a
    first run). A min-max hybrid carries its alpha sweep (its front); its own row is scored at the
    alpha with the best NDCG@10 on the *other* year (cross-fitted). RRF has one point."""
    from esp_retrieval.training.evaluate import hybrid as hy

    if ctx.features is None:
        raise RuntimeError("hybrid evaluation needs the features loaded by a trained run first")
    spec = ctx.cfg.methods[method].hybrid
    assert spec is not None
    t0 = time.perf_counter()
    zs = ZeroShot(hidden=int(ctx.timings["hidden_size"]))
    corpus = zs.embed(ctx.features.corpus)
    key = (spec.k1, spec.b, spec.stopwords)
    if key not in ctx.bm25:
        scorer = hy.BM25Scorer(k1=spec.k1, b=spec.b, stopwords=spec.stopwords)
        ctx.bm25[key] = {y: scorer.scores(ctx.bench.texts, list(q.values()))
                         for y, q in ctx.bench.queries.items()}
    years = list(dict.fromkeys(ctx.cfg.heldout_years))
    depth = spec.depth or len(corpus)
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for year in years:
        qids = list(ctx.bench.queries[year])
        dense = zs.embed(np.stack([ctx.features.queries[q] for q in qids])) @ corpus.T
        bm25 = ctx.bm25[key][year]
        if spec.fusion == "minmax":
            sweeps[year] = hy.minmax_sweep(ctx.bench, year, qids, bm25, dense,
                                           alphas=hy.alpha_grid(spec.alpha_step), depth=depth)
        else:
            m = hy.score_fused(ctx.bench, year, qids,
                               hy.rrf_lists(bm25, depth, spec.rrf_k) + hy.rrf_lists(dense, depth, spec.rrf_k))
            sweeps[year] = [{"weights": {}, "ndcg": m.ndcg, "entity_p": m.entity_p}]
    runs: list[Run] = []
    for year in years:
        others = [y for y in years if y != year]
        point = sweeps[year][0]
        if spec.fusion == "minmax":
            alpha = hy.best_alpha(sweeps[others[0]] if others else sweeps[year])
            point = next(p for p in sweeps[year] if math.isclose(p["weights"][hy.BM25], alpha, abs_tol=1e-9))
        ev = ModelEval(ndcg=point["ndcg"], entity_p=point["entity_p"], intent_true=[], intent_pred=[],
                       agreement=math.nan, agreement_intent_only=math.nan, tau=math.nan, erank={},
                       sweep=sweeps[year] if spec.fusion == "minmax" else [])
        alpha_used = float(point["weights"].get(hy.BM25, math.nan))
        runs.append(Run(method, None, year, None, [], ev, None,
                        {"eval_s": time.perf_counter() - t0, "alpha": alpha_used}, None))
    log.info("%s: NDCG@10 %.3f, entity P@10 %.3f", method,
             np.mean([v for r in runs for v in r.result.ndcg.values()]),
             np.mean([v for r in runs for v in r.result.entity_p.values()]))
    return runs


def reference_runs(ctx: Context) -> list[Run]:
    """Every untrained method: the zero-shot trunk and the hybrids."""
    runs: list[Run] = []
    for name, spec in ctx.cfg.methods.items():
        if spec.zero_shot:
            runs.extend(zero_shot_runs(ctx, name))
        elif spec.hybrid is not None:
            runs.extend(hybrid_runs(ctx, name))
    return runs


def run_all(ctx: Context, progress: Any = None, on_seed: Any = None) -> list[Run]:
    """Every trained method x seed x scheduled run (year, intent fold), seed by seed (so a partial
    report can be written after each seed), the zero-shot runs right after the first trained run.

    ``progress(run)`` is called after every run, ``on_seed(seed, runs_so_far)`` after each seed.
    """
    cfg = ctx.cfg
    runs: list[Run] = []
    trained = [m for m, s in cfg.methods.items() if s.trained]
    # The front method first: its first run loads the shared features.
    trained.sort(key=lambda m: m != cfg.front_method)
    for seed in cfg.seeds:
        for method in trained:
            only = cfg.methods[method].seeds
            if only is not None and seed not in only:
                continue
            for year, fold in cfg.schedule():
                runs.append(train_and_evaluate(ctx, method, seed, year, fold))
                if progress is not None:
                    progress(runs[-1])
                if len(runs) == 1:
                    runs.extend(reference_runs(ctx))
        if on_seed is not None:
            on_seed(seed, list(runs))
    return runs
