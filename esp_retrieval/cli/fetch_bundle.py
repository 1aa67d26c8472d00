"""Fetch a bundle from object storage into a local cache, checked against its manifest digest.

The bundle folder at URI (``s3://``, ``gs://``, ``https://``, ``file://``: any fsspec URI whose
library is installed) is fetched into ``CACHE/<sha256>`` once its ``manifest.json`` has the
given sha256 (``esp bundle-info`` prints it as ``manifest_sha256``), every file checked against
the manifest as it arrives (esp_retrieval/service/remote_bundle.py). Prints the local folder as JSON; exit
status 1 with the reason when the digest differs or a file cannot be fetched. The chart's
init container runs it, so that the pod serves a local folder.

Example: esp fetch-bundle s3://models/esp/2026-01-07 --sha256 3f1c... --cache /var/cache/esp-bundles
"""

from __future__ import annotations

import argparse
import json
import sys

from esp_retrieval.service.remote_bundle import BundleFetchError, fetch_bundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="URI of the bundle folder (s3://, gs://, https://, file://)")
    parser.add_argument("--sha256", required=True, help="sha256 of the bundle's manifest.json")
    parser.add_argument("--cache", required=True, help="cache folder; the bundle lands in CACHE/<sha256>")


def run(args: argparse.Namespace) -> int:
    try:
        path = fetch_bundle(args.uri, args.sha256, args.cache)
    except BundleFetchError as exc:
        print(f"bundle not fetched: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"path": str(path), "sha256": args.sha256}))
    return 0
