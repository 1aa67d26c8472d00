"""Embed a corpus with the query encoder of an existing bundle and write a new bundle.

The corpus is a TSV file (``id<TAB>text`` per line, optional ``id<TAB>text`` header) or a
JSONL file (``{"id": ..., "text": ..., other display fields}`` per line), optionally gzipped.
It is streamed in batches (bounded memory). Ids must be unique; a bad line (invalid UTF-8,
missing column/field, duplicate id) stops the run with the line number. Empty texts are
skipped and counted; texts longer than the encoder's max_length tokens are truncated, as
queries are, and counted. The new bundle keeps the source's encoder, layout and operating points.

--engine ray encodes on a Ray cluster (--address or RAY_ADDRESS, else a local one): the corpus
(also .parquet, a folder, or any fsspec URL) read with Ray Data, encoded by a pool of actors
(one GPU each when the cluster has GPUs), written as checksummed shards under --work-dir and
assembled into the same bundle; a rerun after a failure skips the finished shards
(esp_retrieval.training.ray_index).

Example:  esp index --bundle artifacts/demo/bundle --corpus my_docs.jsonl --out artifacts/my_docs
          esp index --engine ray --actors 8 --bundle ... --corpus s3://bucket/docs/ --out ...
          esp index --ann --bundle artifacts/demo/bundle

--ann also builds the approximate weight-aware index (ann/, served with ESP_BACKEND=ivf) into the
new bundle; with --bundle alone it adds the index to that bundle (or to a copy at --out), a new
directory swapped in atomically, and prints the build report (seconds, bytes).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="source bundle (its encoder/ embeds the corpus)")
    parser.add_argument("--corpus", help="corpus file: .tsv or .jsonl (optionally .gz); not with --ann alone")
    parser.add_argument("--out", help="output bundle directory (required with --corpus)")
    parser.add_argument("--batch-size", type=int, default=256, help="documents per batch (default 256)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        default="float32",
        help="stored embedding dtype (default float32)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--ann", action="store_true", help="build the ivf index (ann/) into the bundle")
    parser.add_argument("--ann-nlist", type=int, default=None, help="ivf lists (default sqrt(N))")
    parser.add_argument("--ann-list-dtype", choices=["int8", "float32"], default="int8",
                        help="ivf list storage (default int8)")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="local",
                        help="local: this process (default); ray: a Ray cluster")
    ray = parser.add_argument_group("--engine ray")
    ray.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else local)")
    ray.add_argument("--actors", type=int, default=None,
                     help="encoder actors (default: one per GPU, else one per --threads CPUs)")
    ray.add_argument("--shard-size", type=int, default=4096, help="documents per shard (default 4096)")
    ray.add_argument("--work-dir", default=None, help="shard folder every node sees (default <out>.shards)")
    ray.add_argument("--keep-work", action="store_true", help="keep the shard folder after success")


def _local(args: argparse.Namespace) -> dict[str, Any]:
    from esp_retrieval.training.indexing import index_corpus

    return index_corpus(args.bundle, args.corpus, args.out, batch_size=args.batch_size, dtype=args.dtype,
                        overwrite=args.overwrite, progress=not args.no_progress, threads=args.threads)


def _ray(args: argparse.Namespace) -> dict[str, Any]:
    from esp_retrieval.training.ray_index import index_corpus_ray

    return index_corpus_ray(
        args.bundle, args.corpus, args.out, batch_size=args.batch_size, dtype=args.dtype,
        overwrite=args.overwrite, progress=not args.no_progress, threads=args.threads,
        address=args.address, actors=args.actors, shard_size=args.shard_size, work_dir=args.work_dir,
        keep_work=args.keep_work,
    )


#: --engine name -> how it indexes
ENGINES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"local": _local, "ray": _ray}


def run(args: argparse.Namespace) -> int:
    from esp_retrieval.subspace.bundle import BundleError
    from esp_retrieval.subspace.engine.ivf_index import IvfParams, add_index_to_bundle
    from esp_retrieval.training.data.corpus import CorpusError
    if (args.corpus is None or args.out is None) and not (args.ann and args.corpus is None):
        print("esp index: --corpus and --out are required (or --ann alone)", file=sys.stderr)
        return 2
    params = IvfParams(nlist=args.ann_nlist, list_dtype=args.ann_list_dtype)
    try:
        if args.corpus is None:  # --ann alone: the index of an existing bundle
            summary = add_index_to_bundle(args.bundle, params, out=args.out)
        else:
            summary = ENGINES[args.engine](args)
            if args.ann:
                summary["ann"] = add_index_to_bundle(args.out, params)
    except (CorpusError, BundleError, FileExistsError) as exc:
        print(f"esp index: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0
