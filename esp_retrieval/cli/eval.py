"""Run the ESP ablation on the shipped data and write reports/esp-bench.md with its plots.

Trains every method of the config per seed and held-out TREC DL year on cached frozen-trunk
features, scores held-out queries through the service's scoring path, sweeps ESP serving
weights into Pareto fronts, reads the training logs for gradient diagnostics, clusters
ORCAS-I / MIMICS keywords, and writes the markdown report, PNG plots and a JSON of every
number. ``--quick`` runs the same pipeline on a tiny random BERT and a data slice (seconds).
``--bundle DIR`` also writes the front method's operating points into that bundle's manifest.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_CONFIG = "configs/eval.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"eval YAML (default {DEFAULT_CONFIG})")
    parser.add_argument("--out", default="reports", help="folder for esp-bench.md, its plots and JSON")
    parser.add_argument("--quick", action="store_true", help="tiny random BERT + data slice (pipeline check)")
    parser.add_argument("--data-dir", default=None,
                        help="shipped data folder (default: the repository's data/)")
    parser.add_argument("--work-dir", default=None,
                        help="run folders and training logs (default: a temporary folder for --quick, "
                             "artifacts/eval otherwise)")
    parser.add_argument("--bundle", default=None, help="write the operating points into this bundle")


def run(args: argparse.Namespace) -> int:
    from esp_retrieval.training.data import DEFAULT_DATA_DIR
    from esp_retrieval.training.evaluate.config import load_eval_config
    from esp_retrieval.training.evaluate.operating_points import write_operating_points
    from esp_retrieval.training.evaluate.report import build_report
    from esp_retrieval.training.evaluate.runner import prepare, run_all

    t0 = time.perf_counter()
    cfg = load_eval_config(args.config, quick=args.quick)
    sparse = cfg.methods[cfg.front_method].sparse
    if args.bundle and sparse is not None:
        from esp_retrieval.subspace.bundle import read_bundle

        # its operating points weigh the sparse block: the bundle must carry (and so serve) it
        held = list(read_bundle(args.bundle, verify_checksums=False).sparse)
        if sparse.name not in held:
            print(f"esp eval: --bundle: the front method {cfg.front_method!r} weighs the sparse block "
                  f"{sparse.name!r}, which the bundle does not carry (its sparse blocks: {held}); train it "
                  "with `sparse:` (configs/demo.yaml), drop --bundle or choose a front_method without "
                  "`sparse:`", file=sys.stderr)
            return 2
    data_dir = Path(args.data_dir) if args.data_dir else DEFAULT_DATA_DIR
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="esp-eval-") as tmp:
        work = Path(args.work_dir) if args.work_dir else (Path(tmp) if args.quick else Path("artifacts/eval"))
        ctx = prepare(cfg, data_dir, work)
        n_runs = sum(len([x for x in cfg.seeds if s.seeds is None or x in s.seeds]) * len(cfg.schedule())
                     for s in cfg.methods.values() if s.trained)
        done = [0]

        def progress(r: object) -> None:
            done[0] += 1
            log.info("run %d/%d done (%.1f min elapsed)", done[0], n_runs, (time.perf_counter() - t0) / 60)

        def partial(seed: int, runs: list) -> None:
            # A report after every seed but the last: if the run is stopped, what is done is kept.
            if seed != cfg.seeds[-1]:
                build_report(ctx, runs, out, elapsed_s=time.perf_counter() - t0, quick=args.quick)
                log.info("partial report after seed %d written to %s", seed, out / "esp-bench.md")

        runs = run_all(ctx, progress, partial)
        results = build_report(ctx, runs, out, elapsed_s=time.perf_counter() - t0, quick=args.quick)
    if args.bundle:
        write_operating_points(args.bundle, results["operating_points"])
        log.info("operating points written into %s", args.bundle)
    log.info("report: %s (%.1f min)", out / "esp-bench.md", (time.perf_counter() - t0) / 60)
    return 0
