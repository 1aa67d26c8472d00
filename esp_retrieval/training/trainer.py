"""The training loop over a run's parts: one mini-batch per objective per step, weighting, surgery.

:func:`esp_retrieval.training.run.build_run` assembles the parts from a config; :class:`Trainer` only runs
the loop. Per step (docs/architecture.md, "Training")::

    lambda = weighting.weights()                                     (K,)
    L_k    = loss_k(model, batch_k)                                  unweighted, one batch per task
    g_k    = grad(lambda_k * L_k, shared + task_k params)            torch.autograd.grad, on device
    weighting.observe_gradients(|g_k|shared|)                        optional hook
    shared.grad = surgery.combine([g_k|shared])                      sum | PCGrad (projected, summed)
    task_k.grad = g_k|task_k                                         heads: never projected
    weighting params .grad = grad(weighting.combine(L))              only if it has parameters
    clip, AdamW step, schedule; weighting.update(L)                  DWA sees the unweighted losses

Every step writes one JSONL record (per task: loss, lambda, grad_norm; per pair: cosine and
whether PCGrad projected) and updates a progress bar. Held-out metrics (:mod:`esp_retrieval.training.heldout`)
are computed at the start (the untrained model), every ``eval.every`` steps and at the end.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from esp_retrieval.subspace.atomic import atomic_write_text
from esp_retrieval.training.config import TrainConfig
from esp_retrieval.training.heldout import evaluate_heldout
from esp_retrieval.training.model import ESPModel
from esp_retrieval.training.query_tower import TowerStore
from esp_retrieval.training.run import USE_CONFIG, RunParts, build_run

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model: ESPModel
    metrics: dict[str, Any]  # {"start": {obj: {...}}, "final": {...}, "improved": {obj: bool | None}}
    history: list[dict[str, Any]] = field(default_factory=list)  # the step records
    log_path: Path | None = None
    bundle_path: Path | None = None
    data_hashes: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def _lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


_ParamGroups = tuple[list[nn.Parameter], list[list[nn.Parameter]], list[nn.Parameter]]


class Trainer:
    """The loop over one run's parts (:meth:`step`, :meth:`evaluate`, :meth:`run`, :meth:`export`)."""

    def __init__(self, parts: RunParts, config: TrainConfig, *, progress: bool = True) -> None:
        self.parts, self.config, self.progress = parts, config, progress
        self.model, self.tasks, self.store = parts.model, parts.tasks, parts.store
        self.weighting, self.surgery = parts.weighting, parts.surgery
        self.corpus_ids, self.corpus_texts = parts.corpus_ids, parts.corpus_texts
        self.data_hashes = parts.data_hashes
        self.timings: dict[str, float] = dict(parts.timings)
        self._groups: _ParamGroups | None = None
        #: ``sync(trainer, losses, shared_grads) -> (losses, shared_grads)`` between the per-task
        #: gradients and the surgery; it also averages the heads' ``.grad`` (training.distributed)
        self.sync: Callable[[Trainer, list[float], list[torch.Tensor]],
                            tuple[list[float], list[torch.Tensor]]] | None = None

    # --- features -----------------------------------------------------------------------
    def pooled(self, texts: list[str]) -> torch.Tensor:
        return self.store(texts) if self.store is not None else self.model.pooled(texts)

    def pooled_np(self, texts: list[str]) -> np.ndarray:
        if isinstance(self.store, TowerStore):  # queries through the tower, in evaluation mode
            return self.store.features_np(texts)
        if self.store is not None:
            return self.store(texts).cpu().numpy()
        return self.model.text_features(texts, batch_size=self.config.trunk.encode_batch_size)

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

    def task_gradients(self, lambdas: np.ndarray) -> tuple[list[float], list[torch.Tensor]]:
        """Unweighted losses and flat shared gradients ``grad(lambda_k L_k)`` of one batch per task.

        Each task's own (head) parameters get their gradient added to ``.grad``.
        """
        model = self.model
        shared, owns, _ = self._parameter_groups()
        losses, shared_grads = [], []
        for k, task in enumerate(self.tasks):
            loss = task.loss(task.output(model, self.pooled))
            losses.append(float(loss.detach()))
            own = owns[k]
            if not shared and not own:  # a frozen head on a frozen trunk: its loss is only logged
                continue
            grads = torch.autograd.grad(float(lambdas[k]) * loss, shared + own, allow_unused=True)
            if shared:
                shared_grads.append(torch.cat([
                    (torch.zeros_like(p) if g is None else g).reshape(-1)
                    for p, g in zip(shared, grads[: len(shared)], strict=True)
                ]))
            for p, g in zip(own, grads[len(shared) :], strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g
        return losses, shared_grads

    def step(self, step: int, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        lambdas = self.weighting.weights()
        shared, _, clipped = self._parameter_groups()
        optimizer.zero_grad(set_to_none=True)
        losses, shared_grads = self.task_gradients(lambdas)
        if self.sync is not None:  # data parallel: every rank's mean (esp_retrieval.training.distributed)
            losses, shared_grads = self.sync(self, losses, shared_grads)
        task_norms = [float(g.norm()) for g in shared_grads] if shared else [0.0] * len(self.tasks)
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
        self.weighting.observe_gradients(np.asarray(task_norms))
        own_params = self.weighting.parameters()
        if own_params:
            total = self.weighting.combine(torch.tensor(losses))
            for p, g in zip(own_params, torch.autograd.grad(total, own_params), strict=True):
                p.grad = g
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
        own, lr = self.weighting.parameters(), self.weighting.lr
        if own:  # learned task weights: no decay (it would pull them towards 0)
            groups.append({"params": own, "lr": o.lr if lr is None else lr, "weight_decay": 0.0})
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
        # eval.enabled false: the caller evaluates (the ablation runner), so skip the two corpus passes
        metrics: dict[str, Any] = {"start": self.evaluate() if cfg.eval.enabled else {}}
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
            metrics["final"] = self.evaluate() if cfg.eval.enabled else {}
            evals.append({"step": cfg.optim.steps, **metrics["final"]})
            if log_fh is not None:
                log_fh.write(json.dumps({"step": cfg.optim.steps, "heldout": metrics["final"]}) + "\n")
        finally:
            bar.close()
            if log_fh is not None:
                log_fh.close()
        self.timings["train_s"] = time.perf_counter() - t0
        # None: the objective's block cannot move (frozen head, nothing shared), kept by design
        shared, owns, _ = self._parameter_groups()
        movable = {t.name: bool(shared or owns[k]) for k, t in enumerate(self.tasks)}
        metrics["improved"] = {
            n: (metrics["final"][n]["main"] > metrics["start"][n]["main"]) if movable.get(n, True) else None
            for n in metrics["final"]
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
        from esp_retrieval.training.export import export_bundle

        pooled = self.pooled_np(self.corpus_texts)
        emb = self.model.encode_pooled(pooled)
        spec, sparse = self.config.sparse, None
        if spec is not None:  # the BM25 block over the exported corpus (docs/architecture.md s. 5)
            from esp_retrieval.training.run import data_context
            from esp_retrieval.training.sparse_lexical import build_block

            t0 = time.perf_counter()
            block = build_block(spec, self.corpus_ids, self.corpus_texts, data_context(self.config))
            sparse = {spec.name: block}
            self.timings["sparse_s"] = time.perf_counter() - t0
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
            sparse=sparse,
            sparse_weights=None if spec is None else {spec.name: spec.default_weight},
        )


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))


def train(
    config: TrainConfig,
    out_dir: str | Path | None = None,
    *,
    features_cache: Any = USE_CONFIG,
    trunk_path: str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train per ``config``; with ``out_dir``, write the step log, metrics and (if enabled) the bundle.

    ``features_cache``: folder for frozen-trunk features (default: ``config.trunk.features_cache``;
    ``None`` disables caching). ``trunk_path`` overrides ``config.trunk.path``.
    """
    parts = build_run(config, features_cache=features_cache, trunk_path=trunk_path)
    return Trainer(parts, config, progress=progress).run(out_dir)
