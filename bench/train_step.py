"""Training step time: ``pcgrad+dwa`` vs ``sum+equal`` on the same model and batches.

Both variants run the trainer's real step (per-task gradients of the shared parameters with
``torch.autograd.grad``, which the step log needs either way); ``plain`` is one backward of
the summed loss, for reference. Modes: ``frozen`` (cached trunk features, adapter + heads
train) and ``top:2`` (the top two transformer layers train too). Prints one JSON line:
median seconds per step per variant and mode, and the ratios (goal: <= 1.5x frozen,
<= 2.2x top:2).

Usage: python bench/train_step.py [--model minilm|tiny] [--steps 8] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import tempfile
import time
from typing import Any

import torch


def _parts(batch: int, seed: int = 0):
    from esp_retrieval.training.data.objectives import ClassSet, HeldOut, ObjectiveData, PairSet
    from esp_retrieval.training.data.orcas import load_orcas
    from esp_retrieval.training.data.trec import load_trec

    trec = load_trec()
    text_of = dict(zip(trec.pids, trec.passages, strict=True))
    qtext = {q: t for qs in trec.queries.values() for q, t in qs.items()}
    pairs = [
        (q, p)
        for q, rels in sorted(trec.qrels.items())
        for p, g in sorted(rels.items())
        if g >= 2 and p in text_of and q in qtext
    ][: 4 * batch]
    sem = PairSet(
        [qtext[q] for q, _ in pairs],
        [text_of[p] for _, p in pairs],
        [f"{q}:{i}" for i, (q, _) in enumerate(pairs)],
    )
    ent = PairSet(list(sem.anchors[::-1]), list(sem.positives[::-1]), list(sem.groups[::-1]))
    o = load_orcas()
    intent = ClassSet(o.texts[: 4 * batch], o.labels[: 4 * batch], o.classes)
    return {
        "semantic": ObjectiveData("semantic", sem, HeldOut("retrieval"), {}),
        "entity": ObjectiveData("entity", ent, HeldOut("entity"), {}),
        "intent": ObjectiveData("intent", intent, HeldOut("classification"), {}),
    }, o.classes


def objectives_for(batch: int) -> list[dict[str, Any]]:
    """The three objectives both training benchmarks train, ``batch`` pairs or texts each."""
    return [
        {"name": "semantic", "dim": 256, "data": "semantic", "loss": "info_nce", "batch_size": batch},
        {"name": "entity", "dim": 96, "data": "entity", "loss": "info_nce", "batch_size": batch},
        {"name": "intent", "dim": 32, "data": "intent", "loss": "cross_entropy", "batch_size": batch},
    ]


def tasks_for(objectives: list[dict[str, Any]], datas: dict[str, Any], batch: int) -> list[Any]:
    """One training task per objective over the data of :func:`_parts`."""
    from esp_retrieval.training.losses import build_loss
    from esp_retrieval.training.run import Task

    return [
        Task(o["name"], datas[o["name"]], build_loss(o["loss"]), batch_size=batch, seed=k,
             intent=o["name"] == "intent")
        for k, o in enumerate(objectives)
    ]


def time_steps(tr: Any, steps: int) -> list[float]:
    """Seconds of each of ``steps`` optimiser steps of trainer ``tr``, after two warm-up steps."""
    opt, _ = tr.optimizer()
    tr.model.train()
    per = []
    for s in range(steps + 2):
        t0 = time.perf_counter()
        tr.step(s, opt)
        if s >= 2:  # two warm-up steps
            per.append(time.perf_counter() - t0)
    return per


def run(model_name: str, steps: int, batch: int, threads: int | None) -> dict:
    from esp_retrieval.training.config import TrainConfig
    from esp_retrieval.training.features import FeatureStore
    from esp_retrieval.training.run import RunParts, build_methods, build_model, default_trunk_path
    from esp_retrieval.training.trainer import Trainer

    if threads:
        torch.set_num_threads(threads)
    datas, classes = _parts(batch)
    tmp = None
    if model_name == "tiny":
        from esp_retrieval.training.tiny import save_tiny_bert

        tmp = tempfile.mkdtemp(prefix="bench-tiny-")
        path = str(save_tiny_bert(tmp, datas["semantic"].train.positives[:500]))
    else:
        path = default_trunk_path()
    objectives = objectives_for(batch)
    variants = {"sum+equal": ("sum", "equal"), "pcgrad+dwa": ("pcgrad", "dwa")}
    result: dict = {
        "bench": "train_step",
        "model": model_name,
        "batch_size": batch,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
    }
    for mode in ("frozen", "top:2"):
        base_cfg = TrainConfig(
            trunk={"path": path, "mode": mode, "max_length": 128, "features_cache": None},
            objectives=objectives,
            optim={"steps": steps, "warmup_steps": 0},
        )
        model0 = build_model(base_cfg, classes)
        store = None
        if mode == "frozen":
            texts = sorted({t for d in datas.values() for t in d.train.texts_used()})
            store = FeatureStore(texts, model0.trunk.encode(texts), torch.device("cpu"))
        times = {}
        for label, (surgery, weighting) in variants.items():
            cfg = base_cfg.model_copy(
                update={
                    "surgery": base_cfg.surgery.model_copy(update={"name": surgery}),
                    "weighting": base_cfg.weighting.model_copy(
                        update={"name": weighting, "params": {"window": 2} if weighting == "dwa" else {}}
                    ),
                }
            )
            model = copy.deepcopy(model0)
            tasks = tasks_for(objectives, datas, batch)
            methods = build_methods(cfg, [t.name for t in tasks])
            tr = Trainer(RunParts(model, tasks, *methods, store=store), cfg, progress=False)
            times[label] = statistics.median(time_steps(tr, steps))
        result[mode] = {k: round(v, 5) for k, v in times.items()}
        result[f"ratio_{mode}"] = round(times["pcgrad+dwa"] / times["sum+equal"], 3)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["minilm", "tiny"], default="minilm")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    print(json.dumps(run(args.model, args.steps, args.batch_size, args.threads)))


if __name__ == "__main__":
    main()
