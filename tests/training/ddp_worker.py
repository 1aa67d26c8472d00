"""One rank of the data-parallel test (``torchrun --standalone --nproc_per_node 2 ddp_worker.py ...``).

Runs ``--steps`` trainer steps with the all-reduce sync and, after every step, gathers every
rank's flat parameter vector; rank 0 writes them (``params``: (steps, world, P)) and the step
records to ``--out`` (an ``.npz`` and a ``.json`` beside it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from esp_retrieval.training.distributed import build_trainer, close, init_process_group
from tests.conftest import tiny_train_config


def ddp_config(data_dir: str, bert_dir: str, steps: int):
    """The run both the ranks and the single-process reference train."""
    return tiny_train_config(
        Path(data_dir),
        Path(bert_dir),
        optim={"steps": steps, "lr": 0.01, "warmup_steps": 0, "grad_clip": 1.0},
        weighting={"name": "dwa", "params": {"window": 1}},
        surgery={"name": "pcgrad", "params": {"seed": 3}},
    )


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--bert-dir", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = ddp_config(args.data_dir, args.bert_dir, args.steps)
    rank = init_process_group(cfg)
    trainer = build_trainer(cfg, rank, features_cache=None, progress=False)
    optimizer, schedule = trainer.optimizer()
    trainer.model.train()
    per_step, records = [], []
    for step in range(1, args.steps + 1):
        records.append(trainer.step(step, optimizer))
        schedule.step()
        mine = flat_params(trainer.model)
        everyone = [torch.empty_like(mine) for _ in range(rank.world)]
        dist.all_gather(everyone, mine)
        per_step.append(torch.stack(everyone).numpy())
    if rank.is_main:
        np.savez(args.out, params=np.stack(per_step))
        Path(args.out).with_suffix(".json").write_text(json.dumps(records), "utf-8")
    dist.barrier()
    close()


if __name__ == "__main__":
    main()
