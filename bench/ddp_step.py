"""Per-step cost of data-parallel training (torchrun, gloo) against one process.

Runs the trainer's real step (PCGrad + DWA, three objectives, frozen trunk features) on the
same per-rank batches: ``single`` in this process, ``ddp`` as ``torchrun --nproc_per_node N``
ranks each taking its own batches and averaging per-task gradients, head gradients and losses in
one all-reduce before PCGrad (esp_retrieval.training.distributed). Each process uses one thread. Prints one
JSON line: median seconds per step of each, the all-reduce's median share, the bytes it moves,
and ``ratio`` (ddp step / single step; a rank does one rank's work plus the all-reduce, so
anything above 1 is the data-parallel overhead at this size on this machine).

Usage: python bench/ddp_step.py [--model tiny|minilm] [--steps 20] [--batch-size 32] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _trainer(model_name: str, batch: int, rank: int, world: int, trunk_dir: str | None):
    from bench.train_step import _parts, objectives_for, tasks_for
    from esp_retrieval.training.config import TrainConfig
    from esp_retrieval.training.distributed import shard_task
    from esp_retrieval.training.features import FeatureStore
    from esp_retrieval.training.run import RunParts, build_methods, build_model, default_trunk_path
    from esp_retrieval.training.trainer import Trainer

    datas, classes = _parts(batch)
    path = trunk_dir if model_name == "tiny" else default_trunk_path()
    objectives = objectives_for(batch)
    cfg = TrainConfig(
        trunk={"path": path, "mode": "frozen", "max_length": 128, "features_cache": None},
        objectives=objectives,
        optim={"steps": 1000, "warmup_steps": 0},
        weighting={"name": "dwa", "params": {"window": 2}},
        surgery={"name": "pcgrad"},
    )
    model = build_model(cfg, classes)
    texts = sorted({t for d in datas.values() for t in d.train.texts_used()})
    store = FeatureStore(texts, model.trunk.encode(texts), torch.device("cpu"))
    tasks = tasks_for(objectives, datas, batch)
    if world > 1:
        tasks = [shard_task(t, rank, world, cfg.seed) for t in tasks]
    return Trainer(RunParts(model, tasks, *build_methods(cfg, [t.name for t in tasks]), store=store), cfg,
                   progress=False)


def worker(args: argparse.Namespace) -> None:
    """One torchrun rank: time the steps; rank 0 writes the result file."""
    import torch.distributed as dist

    from bench.train_step import time_steps
    from esp_retrieval.training.distributed import GradientAllReduce, broadcast_state

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tr = _trainer(args.model, args.batch_size, rank, world, args.trunk_dir)
    reduce = GradientAllReduce(world)
    sync_s: list[float] = []
    sizes: list[int] = []

    def timed(trainer, losses, grads):
        t0 = time.perf_counter()
        out = reduce(trainer, losses, grads)
        sync_s.append(time.perf_counter() - t0)
        sizes.append(4 * (len(losses) + sum(g.numel() for g in grads)))
        return out

    tr.sync = timed
    broadcast_state(tr)
    per = time_steps(tr, args.steps)
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps({
            "step_s": statistics.median(per), "sync_s": statistics.median(sync_s[2:]),
            "allreduce_bytes_shared": sizes[-1],
        }))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["tiny", "minilm"], default="tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trunk-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        worker(args)
        return
    from bench.train_step import time_steps

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        trunk_dir = None
        if args.model == "tiny":
            from bench.train_step import _parts
            from esp_retrieval.training.tiny import save_tiny_bert

            datas, _ = _parts(args.batch_size)
            trunk_dir = str(save_tiny_bert(Path(tmp) / "bert", datas["semantic"].train.positives[:500]))
        single = statistics.median(time_steps(_trainer(args.model, args.batch_size, 0, 1, trunk_dir),
                                               args.steps))
        out = Path(tmp) / "ddp.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(args.ranks), str(Path(__file__).resolve()), "--model", args.model,
               "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--worker-out", str(out)]
        if trunk_dir:
            cmd += ["--trunk-dir", trunk_dir]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        ddp = json.loads(out.read_text())
    print(json.dumps({
        "bench": "ddp_step",
        "model": args.model,
        "batch_size_per_rank": args.batch_size,
        "ranks": args.ranks,
        "steps": args.steps,
        "threads_per_process": 1,
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "single_step_s": round(single, 5),
        "ddp_step_s": round(ddp["step_s"], 5),
        "ddp_allreduce_s": round(ddp["sync_s"], 5),
        "allreduce_bytes_losses_and_shared": ddp["allreduce_bytes_shared"],
        "ratio": round(ddp["step_s"] / single, 3),
    }, sort_keys=True))


if __name__ == "__main__":
    main()
