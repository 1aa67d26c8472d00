"""Validate a bundle (checksums, shapes, layout, ids) and print its summary as JSON.

Exit status 0 when the bundle is valid, 1 with the reason when it is not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from esp_retrieval.subspace.bundle import BundleError, read_bundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="bundle directory")
    parser.add_argument(
        "--no-verify", action="store_true", help="skip the sha256 checks (faster on big corpora)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        bundle = read_bundle(args.bundle, verify_checksums=not args.no_verify)
    except BundleError as exc:
        print(f"invalid bundle: {exc}", file=sys.stderr)
        return 1
    m = bundle.manifest
    summary = {
        "path": str(bundle.path),
        "version": bundle.version,
        "corpus": m["corpus"],
        "layout": [o.to_dict() for o in bundle.layout.objectives],
        "operating_points": sorted(bundle.operating_points),
        "encoder": bundle.encoder_dir is not None,
        # what a registry file's `bundle.sha256` names (esp_retrieval.service.rollout): it pins every file
        "manifest_sha256": hashlib.sha256((Path(args.bundle) / "manifest.json").read_bytes()).hexdigest(),
        "sections": sorted(set(m) - {"files", "layout", "corpus"}),
        # the sparse blocks (name, kind, vocab_size, default_weight), for a bundle that has them
        **({"sparse": m["sparse"]} if bundle.sparse else {}),
    }
    print(json.dumps(summary, indent=2))
    return 0
