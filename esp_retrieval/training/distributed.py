"""Data-parallel ``esp train`` under ``torchrun`` (docs/architecture.md, "Training").

``torchrun --nproc_per_node N -m esp_retrieval.cli train --config ...`` starts N ranks; each builds the
same run (same seed), takes its own share of every task's batches and runs the trainer's step.
Process group: gloo on CPU, nccl when ``device`` is CUDA (rank ``r`` on ``cuda:LOCAL_RANK``).

Why the step does not use ``DistributedDataParallel``'s reducer: one step takes K
``torch.autograd.grad`` calls (one per task, the per-task gradients PCGrad needs) and never a
plain ``backward``, so DDP's gradient hooks would fire K times or not at all and PCGrad would
project each rank's *local* gradients, giving every rank a different update. Instead the
trainer's ``sync`` hook (:class:`GradientAllReduce`) averages, in ONE all-reduce per step, a flat
buffer holding every task's unweighted loss, every task's shared gradient and the heads'
gradients, *before* the surgery. Every rank then projects the same ``(K, P)`` gradients with
the same seeded PCGrad order, feeds DWA the same (rank-averaged) losses and applies the same
AdamW update, so the parameters stay identical without any further communication (what DDP's
constructor does, broadcasting rank 0's parameters and buffers, is done once at the start).

Batches: rank ``r`` of ``W`` takes batches ``r, r + W, r + 2W, ...`` of each task's seeded stream
(the per-rank batch is the configured ``batch_size``; one step sees ``W`` of them). In-batch
negatives stay within a rank's batch, as in any data-parallel run without an all-gather. Hard
negatives are drawn by rank 0 with the task's own generator and by rank ``r > 0`` with one
seeded by ``(seed, task, r)``. :class:`ShardAccumulatingTrainer` is the single-process
equivalent: one process, the W shards of every step in turn, their gradients averaged; a W-rank
run matches it to float rounding.

Only rank 0 writes the step log, metrics and bundle and shows progress.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from esp_retrieval.training.config import TrainConfig
from esp_retrieval.training.run import USE_CONFIG, RunParts, Task, build_run
from esp_retrieval.training.trainer import Trainer, TrainResult

log = logging.getLogger(__name__)


def launched_by_torchrun() -> bool:
    """True inside a process that ``torchrun`` (or any launcher setting its variables) started."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    local_rank: int
    device: str
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_process_group(config: TrainConfig) -> Rank:
    """Join the torchrun job: nccl on ``cuda:LOCAL_RANK`` when ``config.device`` is CUDA, else gloo."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = config.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return Rank(dist.get_rank(), dist.get_world_size(), local, f"cuda:{local}" if cuda else config.device,
                backend)


def shard_batches(batches: Iterator[list[int]], rank: int, world: int) -> Iterator[list[int]]:
    """Batches ``rank, rank + world, ...`` of a stream."""
    return itertools.islice(batches, rank, None, world)


def shard_task(
    task: Task, rank: int, world: int, seed: int, batches: Iterator[list[int]] | None = None
) -> Task:
    """A copy of ``task`` that draws rank ``rank``'s batches and hard negatives."""
    out = copy.copy(task)
    out.batches = shard_batches(task.batches if batches is None else batches, rank, world)
    out.rng = task.rng if rank == 0 else random.Random(f"{seed}:{task.name}:{rank}")
    return out


def _heads(trainer: Trainer) -> list[torch.nn.Parameter]:
    """Every task's own trainable parameters, each once, in a fixed order."""
    _, owns, _ = trainer._parameter_groups()
    seen: set[int] = set()
    out = []
    for ps in owns:
        for p in ps:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class GradientAllReduce:
    """The trainer's ``sync``: the rank mean of losses, per-task shared gradients and head gradients.

    One flat buffer, one ``all_reduce`` per step. A head parameter without a gradient on every
    rank stays without one (AdamW then skips it, as in a single process).
    """

    def __init__(self, world: int, group: Any = None) -> None:
        self.world, self.group = world, group

    def __call__(
        self, trainer: Trainer, losses: list[float], shared_grads: list[torch.Tensor]
    ) -> tuple[list[float], list[torch.Tensor]]:
        heads = _heads(trainer)
        ref = shared_grads[0] if shared_grads else (heads[0] if heads else torch.zeros(0))
        device, dtype = ref.device, torch.float32
        parts = [torch.tensor(losses, dtype=dtype, device=device)]
        parts += [g.to(dtype) for g in shared_grads]
        parts.append(torch.tensor([p.grad is not None for p in heads], dtype=dtype, device=device))
        parts += [(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1).to(dtype) for p in heads]
        buf = torch.cat(parts)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        buf /= self.world
        k = len(losses)
        mean_losses = buf[:k].tolist()
        offset = k
        out = []
        for g in shared_grads:
            out.append(buf[offset : offset + g.numel()].view_as(g).to(g.dtype))
            offset += g.numel()
        has = buf[offset : offset + len(heads)].tolist()
        offset += len(heads)
        for i, p in enumerate(heads):
            n = p.numel()
            p.grad = buf[offset : offset + n].view_as(p).to(p.dtype).clone() if has[i] > 0 else None
            offset += n
        return mean_losses, out


class ShardAccumulatingTrainer(Trainer):
    """One process doing what a ``world``-rank run does: per step, every rank's shard in turn,
    gradients and losses averaged (the reference a data-parallel run is tested against, and
    gradient accumulation on one device)."""

    def __init__(self, parts: RunParts, config: TrainConfig, world: int, *, progress: bool = True) -> None:
        super().__init__(parts, config, progress=progress)
        self.world = world
        streams = [itertools.tee(t.batches, world) for t in parts.tasks]
        self.shards = [
            [shard_task(t, r, world, config.seed, streams[k][r]) for k, t in enumerate(parts.tasks)]
            for r in range(world)
        ]
        self.tasks = self.shards[0]

    def task_gradients(self, lambdas: np.ndarray) -> tuple[list[float], list[torch.Tensor]]:
        total_losses = np.zeros(len(self.shards[0]))
        total: list[torch.Tensor] = []
        try:
            for shard in self.shards:
                self.tasks = shard
                losses, grads = super().task_gradients(lambdas)
                total_losses += np.asarray(losses)
                total = grads if not total else [a + b for a, b in zip(total, grads, strict=True)]
        finally:
            self.tasks = self.shards[0]
        for p in _heads(self):
            if p.grad is not None:
                p.grad /= self.world
        return (total_losses / self.world).tolist(), [g / self.world for g in total]


def broadcast_state(trainer: Trainer, src: int = 0) -> None:
    """Rank ``src``'s parameters and buffers everywhere (what DDP's constructor does)."""
    tensors = [*trainer.model.parameters(), *trainer.model.buffers(), *trainer.weighting.parameters()]
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=src)


def build_trainer(
    config: TrainConfig, rank: Rank, *, features_cache: Any = USE_CONFIG, trunk_path: str | None = None,
    progress: bool = True,
) -> Trainer:
    """This rank's trainer: the run built on its device, its shard of the batches, the all-reduce sync.

    With a features cache, rank 0 computes the frozen-trunk features first and the others read them.
    """
    config = config.model_copy(update={"device": rank.device})
    cache = config.trunk.features_cache if features_cache is USE_CONFIG else features_cache
    if cache is not None and not rank.is_main:
        dist.barrier()
    parts = build_run(config, features_cache=features_cache, trunk_path=trunk_path)
    if cache is not None and rank.is_main:
        dist.barrier()
    parts.tasks = [shard_task(t, rank.rank, rank.world, config.seed) for t in parts.tasks]
    trainer = Trainer(parts, config, progress=progress and rank.is_main)
    trainer.sync = GradientAllReduce(rank.world)
    broadcast_state(trainer)
    return trainer


def train_distributed(
    config: TrainConfig,
    out_dir: str | Path | None = None,
    *,
    features_cache: Any = USE_CONFIG,
    trunk_path: str | None = None,
    progress: bool = True,
) -> tuple[Rank, TrainResult]:
    """:func:`esp_retrieval.training.trainer.train` on every torchrun rank; only rank 0 writes ``out_dir``."""
    rank = init_process_group(config)
    if not rank.is_main:
        logging.getLogger().setLevel(logging.WARNING)
    log.info("data parallel: %d ranks, backend %s", rank.world, rank.backend)
    trainer = build_trainer(config, rank, features_cache=features_cache, trunk_path=trunk_path,
                            progress=progress)
    result = trainer.run(out_dir if rank.is_main else None)
    result.timings["ranks"] = float(rank.world)
    dist.barrier()
    return rank, result


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
