"""Precompute the frozen-trunk features of a config's export corpus into a folder.

The first frozen-trunk run over a corpus spends nearly all its time in the transformer
(all-MiniLM-L6-v2 over the 24,884-passage TREC DL pool). The repository
ships that pass's output in data/trunk-features, made with

    esp features --config configs/demo.yaml --out data/trunk-features

and `esp train` reads it first (trunk.features_shipped) wherever the trunk weights, max_length
and texts match its keys; anything else is computed. Chunks already in --out are kept, the rest
are computed with a progress bar and written atomically. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default="configs/demo.yaml", help="YAML config (default configs/demo.yaml)"
    )
    parser.add_argument("--out", required=True, help="folder for the feature chunks (created if missing)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pydantic import ValidationError

    from esp_retrieval.training.config import load_config
    from esp_retrieval.training.features import pooled_features, trunk_fingerprint
    from esp_retrieval.training.model import Trunk, TrunkMode
    from esp_retrieval.training.run import data_context, default_trunk_path, load_corpus

    try:
        cfg = load_config(args.config)
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        print(f"esp features: invalid config {args.config}: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"esp features: --out {args.out} exists and is not a folder", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    path = cfg.trunk.path or default_trunk_path()
    trunk = Trunk.from_pretrained(path, max_length=cfg.trunk.max_length, mode=TrunkMode.parse("frozen"))
    _, texts = load_corpus(cfg, data_context(cfg))
    fp = trunk_fingerprint(trunk)
    feats = pooled_features(
        trunk, texts, out, fingerprint=fp, batch_size=cfg.trunk.encode_batch_size,
        desc="corpus features",
    )
    summary = {
        "out": args.out,
        "texts": len(texts),
        "shape": list(feats.shape),
        "trunk_fingerprint": fp,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary, indent=2))
    return 0
