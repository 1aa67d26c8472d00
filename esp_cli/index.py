"""Embed a corpus with the query encoder of an existing bundle and write a new bundle.

The corpus is a TSV file (``id<TAB>text`` per line, optional ``id<TAB>text`` header) or a
JSONL file (``{"id": ..., "text": ..., other display fields}`` per line), optionally gzipped.
It is streamed in batches (bounded memory). Ids must be unique; a bad line (invalid UTF-8,
missing column/field, duplicate id) stops the run with the line number. Empty texts are
skipped and counted; texts longer than the encoder's max_length tokens are truncated, as
queries are, and counted. The new bundle keeps the source's encoder, layout and operating points.

Example:  esp index --bundle artifacts/demo/bundle --corpus my_docs.jsonl --out artifacts/my_docs
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="source bundle (its encoder/ embeds the corpus)")
    parser.add_argument("--corpus", required=True, help="corpus file: .tsv or .jsonl (optionally .gz)")
    parser.add_argument("--out", required=True, help="output bundle directory")
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


def run(args: argparse.Namespace) -> int:
    from subspace.bundle import BundleError
    from training.data.corpus import CorpusError
    from training.indexing import index_corpus

    try:
        summary = index_corpus(
            args.bundle,
            args.corpus,
            args.out,
            batch_size=args.batch_size,
            dtype=args.dtype,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            threads=args.threads,
        )
    except (CorpusError, BundleError, FileExistsError) as exc:
        print(f"esp index: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0
