"""Intent macro-F1 of the eval's front method, alone, with nested validation for choosing its recipe.

``esp eval`` scores the intent head by stratified 5-fold cross-validation over ORCAS-I (run f
holds out fold f and TREC DL year f mod 2; macro-F1 over the pooled out-of-fold predictions of
a seed). This script trains exactly those runs (the eval config's merged training config of the
method, same seeds, same schedule) and reads only the intent head, so a recipe costs minutes, not
the whole ablation. Under ESP the intent head and prototypes share no parameter with the other
objectives; they still train beside them (same steps, same joint gradient clipping).

``--mode inner``: nested validation for choosing a recipe without the outer test folds: run f
also leaves fold (f + 1) mod k out of training and is scored on it, never on fold f, so every
fold serves once as a validation fold of a model that trained on neither it nor its outer test
fold. ``--mode outer``: the eval's own protocol.

Each ``--candidate NAME=JSON`` deep-merges JSON over the method's training config (``intent``
merges into the intent objective), e.g. ``dim64='{"intent": {"dim": 64}}'``. Prints one JSON
line: per candidate, the macro-F1 of each seed and their mean and std (sample std, ddof=1, as the
report's), and each seed's agreement@10 (default serving weights, pooled over its runs).

Usage: python bench/intent_cv.py [--config configs/eval.yaml] [--method esp_sparse]
       [--seeds 0 1 2] [--mode outer|inner] --candidate current='{}' --candidate NAME=JSON ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, progress


def _candidate(text: str) -> tuple[str, dict[str, Any]]:
    name, _, js = text.partition("=")
    return name, json.loads(js or "{}")


def _training_dict(
    cfg: Any, method: str, run: tuple[int, str, int], over: dict[str, Any]
) -> dict[str, Any]:
    """The eval's training config of ``method`` for run ``(seed, year, fold)``, ``over`` merged in."""
    from esp_retrieval.training.evaluate.config import deep_merge

    seed, year, fold = run
    d = cfg.training_dict(method, seed=seed, heldout_year=year, intent_fold=fold)
    over = dict(over)
    intent = over.pop("intent", None)
    d = deep_merge(d, over)
    if intent:
        d["objectives"] = [deep_merge(o, intent) if o.get("data") == "intent" else o for o in d["objectives"]]
    d["eval"] = {**d.get("eval", {}), "enabled": False}
    d["export"] = {"enabled": False}
    return d


def run_one(d: dict[str, Any], drop_fold: int | None, texts: list[str], labels: list[int],
            rows: list[int]) -> tuple[np.ndarray, float]:
    """Train one run; return the argmax intent of ``texts[rows]`` and their agreement@10 among all
    ``texts`` at the default serving weights (as the eval computes it). ``drop_fold`` leaves that
    ORCAS-I fold out of the intent training rows too."""
    import esp_retrieval.training.data.objectives as obj
    from esp_retrieval.training.config import TrainConfig
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer

    original = obj.BUILDERS["intent"]
    if drop_fold is not None:
        def build(ctx: Any, **kw: Any) -> Any:
            from esp_retrieval.training.data.orcas import load_orcas

            data = original(ctx, **kw)
            orcas = load_orcas(ctx.data_dir, kw.get("classes", "3"))
            k = ctx.split.intent_folds
            folds = obj.stratified_folds(list(orcas.qids), list(orcas.labels), k)
            dropped = {t for t, f in zip(orcas.texts, folds, strict=True) if f == drop_fold}
            tr = data.train
            assert isinstance(tr, obj.ClassSet)
            keep = [i for i, t in enumerate(tr.texts) if t not in dropped]
            data.train = obj.ClassSet([tr.texts[i] for i in keep], [tr.labels[i] for i in keep], tr.classes)
            gone = [i for i in range(len(tr.texts)) if tr.texts[i] in dropped]  # featurised, never trained
            data.heldout.texts += [tr.texts[i] for i in gone]
            data.heldout.labels += [tr.labels[i] for i in gone]
            return data

        obj.BUILDERS["intent"] = build
    try:
        tc = TrainConfig(**d)
        trainer = Trainer(build_run(tc), tc, progress=False)
        result = trainer.run(None)
    finally:
        obj.BUILDERS["intent"] = original
    from esp_retrieval.training.evaluate.evaluator import ModelEmbedder
    from esp_retrieval.training.evaluate.metrics import intent_agreement_at_k
    from esp_retrieval.training.evaluate.retrieval import K_EVAL, neighbours

    assert trainer.store is not None
    feats = trainer.store(texts).cpu().numpy()
    probs = result.model.intent_probs_pooled(feats[rows])
    embedder = ModelEmbedder(result.model)
    nb = neighbours(embedder.embed(feats), embedder.layout, None, rows, K_EVAL)
    return np.argmax(probs, axis=1), intent_agreement_at_k(labels, nb, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/eval.yaml")
    ap.add_argument("--method", default=None, help="default: the config's front_method")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the config's seeds")
    ap.add_argument("--mode", choices=("outer", "inner"), default="outer")
    ap.add_argument("--candidate", action="append", default=[], help="NAME=JSON (repeatable)")
    args = ap.parse_args()

    from esp_retrieval.subspace.metrics import macro_f1
    from esp_retrieval.training.data.objectives import stratified_folds
    from esp_retrieval.training.data.orcas import load_orcas
    from esp_retrieval.training.evaluate.config import load_eval_config

    cfg = load_eval_config(args.config)
    method = args.method or cfg.front_method
    seeds = args.seeds if args.seeds is not None else list(cfg.seeds)
    classes = next(o for o in cfg.training["objectives"] if o.get("data") == "intent").get(
        "data_params", {}).get("classes", "3")
    orcas = load_orcas(None, classes)
    k = cfg.intent_folds
    assert k is not None, "the eval config needs intent_folds"
    folds = stratified_folds(list(orcas.qids), list(orcas.labels), k)
    candidates = [_candidate(c) for c in args.candidate] or [("current", {})]
    out: dict[str, Any] = {"method": method, "mode": args.mode, "seeds": seeds, "folds": k, "candidates": {}}
    t0 = time.perf_counter()
    for name, over in candidates:
        per_seed: list[float] = []
        agreements: list[float] = []
        for seed in seeds:
            true: list[int] = []
            pred: list[int] = []
            agree: list[tuple[float, int]] = []
            for year, fold in cfg.schedule():
                assert fold is not None
                scored = fold if args.mode == "outer" else (fold + 1) % k
                drop = None if args.mode == "outer" else scored
                rows = [i for i, f in enumerate(folds) if f == scored]
                d = _training_dict(cfg, method, (seed, year, fold), over)
                p, agreement = run_one(d, drop, list(orcas.texts), list(orcas.labels), rows)
                true += [orcas.labels[i] for i in rows]
                pred += [int(x) for x in p]
                agree.append((agreement, len(rows)))
            f1 = macro_f1(true, pred, list(range(len(orcas.classes))))
            per_seed.append(f1)
            agreements.append(float(np.average([a for a, _ in agree], weights=[n for _, n in agree])))
            progress(f"{name} seed {seed} ({args.mode}): macro-F1 {f1:.4f}, "
                     f"agreement@10 {agreements[-1]:.4f} ({time.perf_counter() - t0:.0f}s)")
        out["candidates"][name] = {
            "override": over, "f1_per_seed": [round(x, 4) for x in per_seed],
            "mean": round(statistics.fmean(per_seed), 4),
            "std": round(statistics.stdev(per_seed), 4) if len(per_seed) > 1 else 0.0,
            "agreement@10_per_seed": [round(x, 4) for x in agreements],
        }
    out["seconds"] = round(time.perf_counter() - t0, 1)
    emit(out)


if __name__ == "__main__":
    main()
