"""Train the multi-task ESP bi-encoder and export a bundle.

Reads a YAML config (see configs/demo.yaml, every field commented); any field can be
overridden by an environment variable ESP_TRAIN_<FIELD>, nested with "__", e.g.
ESP_TRAIN_OPTIM__STEPS=50 or ESP_TRAIN_TRUNK__MODE=top:2. Writes to --out:
train_log.jsonl (one record per step: per task loss, lambda, grad norm; per task pair the
gradient cosine and whether PCGrad projected), metrics.json (held-out metrics at the start
and the end), config.json, and bundle/ (unless export.enabled is false).

Frozen-trunk features are cached under trunk.features_cache (chunks keyed by a hash of the
trunk weights, max_length and texts; an interrupted run resumes, runs over the same corpus share it).
The repository ships the default trunk's features of the TREC DL pool (data/trunk-features, made by
`esp features`); they are read first when trunk.features_shipped is true and the keys match.

Exit status: 0 when every trainable objective's held-out metric improved over the untrained start
(a frozen block, e.g. the identity semantic head, is kept by design and reported as null),
3 when one did not (the bundle is still written), 2 for an invalid config.

Under torchrun (`torchrun --nproc_per_node N -m esp_retrieval.cli train ...`) the run is data parallel:
gloo on CPU, nccl on CUDA; each task's gradient is averaged over the ranks before PCGrad, so
every rank applies the same update; only rank 0 writes --out (esp_retrieval.training.distributed). A non-zero
exit of rank 0 (3: not improved) makes torchrun exit 1, naming the rank and its exit code.

Example:  esp train --config configs/demo.yaml --out artifacts/demo
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default="configs/demo.yaml", help="YAML config (default configs/demo.yaml)"
    )
    parser.add_argument("--out", default="artifacts/demo", help="output folder (default artifacts/demo)")
    parser.add_argument("--steps", type=int, default=None, help="override optim.steps")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from esp_retrieval.training.config import load_config
    from esp_retrieval.training.trainer import train

    overrides = {}
    try:
        cfg = load_config(args.config)
        if args.steps is not None:
            overrides["optim"] = {**cfg.optim.model_dump(), "steps": args.steps}
            cfg = load_config(args.config, **overrides)
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        print(f"esp train: invalid config {args.config}: {exc}", file=sys.stderr)
        return 2
    from esp_retrieval.training.distributed import close, launched_by_torchrun, train_distributed

    if launched_by_torchrun():  # data parallel; only rank 0 writes and reports
        rank, result = train_distributed(cfg, args.out, progress=not args.no_progress)
        close()
        if not rank.is_main:
            return 0
    else:
        result = train(cfg, args.out, progress=not args.no_progress)
    if result.bundle_path is not None:  # named operating points measured on the held-out year
        from esp_retrieval.training.evaluate.operating_points import attach_operating_points

        attach_operating_points(result.bundle_path, result.model, cfg)
    summary = {
        "out": args.out,
        "bundle": str(result.bundle_path) if result.bundle_path else None,
        "start": {k: v["main"] for k, v in result.metrics["start"].items()},
        "final": {k: v["main"] for k, v in result.metrics["final"].items()},
        "improved": result.metrics["improved"],
        "timings_s": {k: round(v, 1) for k, v in result.timings.items()},
    }
    print(json.dumps(summary, indent=2))
    return 0 if all(v is not False for v in result.metrics["improved"].values()) else 3
