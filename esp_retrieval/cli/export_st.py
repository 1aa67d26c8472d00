"""Export a bundle's query encoder as a sentence-transformers folder.

``SentenceTransformer(OUT, trust_remote_code=True).encode(texts)`` then gives the bundle's
query vectors: ``(n, D)``, each subspace block L2-normalised, in layout order (the vectors
``POST /v1/embeddings`` returns without weights). The folder is the bundle's ``encoder/``
folder plus ``modules.json``, ``config_sentence_transformers.json`` and the module's code:
``esp_st_module.py`` and the ``esp_*.py`` it imports, copies of this project's modules
(esp_retrieval/encoder/st_module.py), so it loads with sentence-transformers alone, without this project
installed (sentence-transformers 6 runs a folder's own module only with
``trust_remote_code=True``), and nothing from the network. Written beside the target, then
renamed into place. Before it finishes, the export is loaded back and checked against the
bundle's encoder.

Example: esp export-st --bundle artifacts/demo/bundle --out artifacts/demo/st-encoder
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
from pathlib import Path

from esp_retrieval.subspace.atomic import atomic_write_text, fsync_dir
from esp_retrieval.subspace.bundle import BundleError, read_bundle

CHECK_TEXTS = ("what is a bank", "open a savings account", "river bank erosion near the bridge")
TOLERANCE = 1e-5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="bundle directory (its encoder/ is exported)")
    parser.add_argument("--out", required=True, help="folder to write (must not exist, unless --force)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")


def export(bundle_dir: Path, out: Path, *, force: bool = False) -> dict[str, object]:
    """Write the folder; returns a summary (dimension, blocks, largest deviation on the check texts)."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from esp_retrieval.encoder.query_encoder import QueryEncoder
    from esp_retrieval.encoder.st_module import (
        copy_encoder_folder,
        sentence_transformers_files,
        vendored_sources,
    )

    bundle = read_bundle(bundle_dir, verify_checksums=True)
    if bundle.encoder_dir is None:
        raise BundleError(f"{bundle_dir}: the bundle has no encoder/ folder to export")
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    try:
        copy_encoder_folder(bundle.encoder_dir, tmp)
        for name, text in {**sentence_transformers_files(), **vendored_sources()}.items():
            atomic_write_text(tmp / name, text)
        atomic_write_text(tmp / "esp_export.json", json.dumps(
            {"bundle_version": bundle.version, "layout": bundle.layout.to_dict()}, indent=2) + "\n")
        expected = QueryEncoder.load(bundle.encoder_dir).encode(list(CHECK_TEXTS))
        model = SentenceTransformer(str(tmp), device="cpu", trust_remote_code=True)
        got = model.encode(list(CHECK_TEXTS), convert_to_numpy=True)
        deviation = float(np.max(np.abs(np.asarray(got) - expected)))
        if not deviation <= TOLERANCE:
            raise RuntimeError(
                f"the export gives vectors {deviation:.3g} away from the encoder's (> {TOLERANCE})"
            )
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "out": str(out),
        "bundle_version": bundle.version,
        "dimension": bundle.layout.dim,
        "subspaces": [{"name": o.name, "offset": o.offset, "dim": o.dim} for o in bundle.layout.objectives],
        "max_abs_deviation": deviation,
    }


def run(args: argparse.Namespace) -> int:
    try:
        summary = export(Path(args.bundle), Path(args.out), force=args.force)
    except (BundleError, FileExistsError, RuntimeError) as exc:
        print(f"export-st: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0
