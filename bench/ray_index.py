"""Indexing throughput: ``esp index --engine ray`` with 1 and 2 actors against the single process.

One corpus (TREC DL passages), one bundle (the default MiniLM trunk, untrained ESP heads, the
demo layout: 384 dims), four runs in one session: ``single`` (esp_retrieval.training.indexing, torch threads =
--threads), ``single_1thread`` (one core's worth), ``ray_1`` and ``ray_2`` (training.ray_index on a
local Ray cluster of --cpus CPUs, one thread per actor). For the Ray runs ``texts_per_s`` counts
from the start of the pipeline (actor start and model load included) and ``steady_texts_per_s``
between the first and the last finished shard; the cluster's own start is reported apart. Also
the per-document costs the capacity note in the README uses: bytes of a stored row (float32 and
float16), of the display payload, and the peak RSS of the single process. One JSON line;
``ratio_*`` are texts/s over ``single``'s.

Usage: python bench/ray_index.py [--docs 768] [--shard-size 64] [--cpus 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _bundle(tmp: Path) -> Path:
    from esp_retrieval.training.config import load_config
    from esp_retrieval.training.export import export_bundle
    from esp_retrieval.training.run import build_model

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    model = build_model(cfg, ["informational", "navigational", "transactional"])
    from esp_retrieval.training.data.trec import iter_corpus

    rows = list(iter_corpus(limit=8))
    return export_bundle(tmp / "bundle", model, [r[0] for r in rows], [r[1] for r in rows], training={},
                         metrics={}, trunk_name="sentence-transformers/all-MiniLM-L6-v2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=768)
    ap.add_argument("--shard-size", type=int, default=64)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import ray

    from bench._common import progress
    from esp_retrieval.training.data.trec import iter_corpus
    from esp_retrieval.training.indexing import index_corpus
    from esp_retrieval.training.ray_index import index_corpus_ray

    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-index-"))
    bundle = _bundle(tmp)
    rows = list(iter_corpus(limit=args.docs))
    corpus = tmp / "docs.tsv"
    corpus.write_text("".join(f"{i}\t{t}\n" for i, t in rows), "utf-8")
    text_bytes = sum(len(t.encode()) for _, t in rows) / len(rows)
    out: dict = {"bench": "ray_index", "docs": len(rows), "shard_size": args.shard_size,
                 "cpus": os.cpu_count(),
                 "cluster_cpus": args.cpus, "cpu": platform.processor() or platform.machine()}

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for label, threads in (("single", args.threads), ("single_1thread", 1)):
        progress(f"{label}: {len(rows)} docs")
        t0 = time.perf_counter()
        s = index_corpus(bundle, corpus, tmp / label, progress=False, threads=threads)
        dt = time.perf_counter() - t0
        out[label] = {"s": round(dt, 2), "texts_per_s": round(s["documents"] / dt, 2), "threads": threads}
    out["single_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["rss_before_mb"] = round(rss0 / 1024, 1)
    import torch

    torch.set_num_threads(args.threads)

    from esp_retrieval.subspace.bundle import read_bundle

    b = read_bundle(tmp / "single")
    out["bytes_per_doc"] = {
        "embedding_float32": int(b.layout.dim * 4),
        "embedding_float16": int(b.layout.dim * 2),
        "text_utf8_mean": round(text_bytes, 1),
        "docs_jsonl_mean": round((tmp / "single" / "docs.jsonl").stat().st_size / len(rows), 1),
        "ids_json_mean": round((tmp / "single" / "ids.json").stat().st_size / len(rows), 1),
    }
    t0 = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    out["ray_init_s"] = round(time.perf_counter() - t0, 2)
    try:
        for n in (1, 2):
            label = f"ray_{n}"
            progress(f"{label}: {len(rows)} docs, {n} actor(s)")
            work = tmp / f"{label}.work"
            t0 = time.perf_counter()
            s = index_corpus_ray(bundle, corpus, tmp / label, progress=False, actors=n, threads=1,
                                 shard_size=args.shard_size, work_dir=work, keep_work=True)
            dt = time.perf_counter() - t0
            marks = sorted(m.stat().st_mtime for m in (work / "shards").glob("*.done.json"))
            steady = (len(rows) - args.shard_size) / (marks[-1] - marks[0]) if len(marks) > 1 else None
            out[label] = {"s": round(dt, 2), "encode_s": s["encode_s"],
                          "texts_per_s": round(s["documents"] / s["encode_s"], 2),
                          "steady_texts_per_s": round(steady, 2) if steady else None, "actors": n}
            rb = read_bundle(tmp / label)
            import numpy as np

            out[label]["max_abs_diff_vs_single"] = float(
                np.abs(np.asarray(rb.embeddings) - np.asarray(b.embeddings)).max())
            assert rb.ids == b.ids
    finally:
        ray.shutdown()
    base = out["single"]["texts_per_s"]
    for label in ("single_1thread", "ray_1", "ray_2"):
        out[f"ratio_{label}"] = round(out[label]["texts_per_s"] / base, 3)
        if out[label].get("steady_texts_per_s"):
            out[f"ratio_{label}_steady"] = round(out[label]["steady_texts_per_s"] / base, 3)
    print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
