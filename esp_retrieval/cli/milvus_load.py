"""Write a bundle into a Milvus collection (the ``milvus`` backend serves it), resumably.

Rows go in bundle order as column-wise inserts of about 1 MiB of vectors each, two in flight
(``esp_retrieval.service.engine.milvus_backend.load_bundle``); an interrupted run is simply run again: it
finds the first bundle row missing, deletes the rows written past it and continues there, so no
row is written twice. A progress bar shows rows written. The collection gets one IP vector
field (the concatenated, block-normalised vector), the document ids, and a typed column per
metadata field of ``docs.jsonl`` (what ``POST /v1/search`` filters on). A collection that
holds another corpus is refused unless ``--replace``. ``--uri`` is a Milvus Lite file
(``*.db``) or a server (``http://host:19530``, with ``--token`` or ``ESP_MILVUS_TOKEN``; one
Milvus Lite file served over TCP: ``esp milvus-lite``); the other settings default to
``ESP_MILVUS_*``.

Example:  esp milvus-load artifacts/demo/bundle --uri artifacts/esp.db --index IVF_FLAT --nlist 256
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from esp_retrieval.service.engine.milvus_backend import INDEXES

    parser.add_argument("bundle", help="bundle directory")
    parser.add_argument("--uri", help="Milvus Lite file (.db) or server URI (default ESP_MILVUS_URI)")
    parser.add_argument("--token", help="server token (default ESP_MILVUS_TOKEN)")
    parser.add_argument("--collection", help="collection name (default ESP_MILVUS_COLLECTION or 'esp')")
    parser.add_argument("--index", type=str.upper, choices=INDEXES, help="vector index (default FLAT: exact)")
    parser.add_argument("--nlist", type=int, help="IVF_FLAT lists")
    parser.add_argument("--hnsw-m", type=int, help="HNSW degree")
    parser.add_argument("--ef-construction", type=int, help="HNSW build breadth")
    parser.add_argument(
        "--batch",
        type=int,
        help="rows per insert request (default: 1 MiB of vectors, 182 rows at 1,440 dims)",
    )
    parser.add_argument("--replace", action="store_true", help="drop a collection that holds another corpus")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from esp_retrieval.service.engine.milvus_backend import MilvusSettings, load_bundle
    from esp_retrieval.subspace.bundle import read_bundle
    from esp_retrieval.subspace.errors import FieldError
    from esp_retrieval.subspace.filters import MetadataSchema

    overrides = {
        "uri": args.uri,
        "token": args.token,
        "collection": args.collection,
        "index": args.index,
        "nlist": args.nlist,
        "hnsw_m": args.hnsw_m,
        "ef_construction": args.ef_construction,
    }
    try:
        settings = MilvusSettings(**{k: v for k, v in overrides.items() if v is not None})
        bundle = read_bundle(args.bundle, mmap=True)
        docs = bundle.docs()
        schema = MetadataSchema.of_bundle(bundle.manifest, docs)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=len(bundle.ids), unit="row", desc=f"milvus-load {settings.collection}")

        def progress(done: int, total: int) -> None:
            if bar is not None:
                bar.n = done
                bar.refresh()

        try:
            report = load_bundle(
                settings,
                bundle.layout,
                bundle.embeddings,
                bundle.ids,
                docs,
                schema=schema,
                bundle_version=bundle.version,
                batch=args.batch,
                replace=args.replace,
                progress=progress,
            )
        finally:
            if bar is not None:
                bar.close()
    except (FieldError, RuntimeError) as exc:
        print(f"esp milvus-load: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, FieldError) else 1
    print(
        json.dumps(
            {
                "collection": report.collection,
                "rows": report.rows,
                "resumed_at": report.skipped,
                "index": report.index,
                "metadata_fields": schema.to_dict(),
                "bundle_version": bundle.version,
                "seconds": round(report.seconds, 2),
                "write_seconds": round(report.write_seconds, 2),
                "index_seconds": round(report.index_seconds, 2),
                "rows_per_second": round((report.rows - report.skipped) / max(report.seconds, 1e-9)),
                "batch": report.batch,
            },
            indent=2,
        )
    )
    return 0
