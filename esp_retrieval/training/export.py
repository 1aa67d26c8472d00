"""Export a trained model as a bundle (docs/architecture.md s. 4): query encoder + embeddings + manifest.

The encoder folder is written by :meth:`esp_retrieval.training.model.ESPModel.save_encoder` in the format
``encoder/query_encoder.py`` documents; the corpus is embedded with the same model (or the caller
passes embeddings it already has, e.g. from cached frozen-trunk features). The manifest
gets the sections ``encoder``, ``training`` (config, data hashes, final metrics) and
``operating_points`` (``{}`` unless given), and ``sparse`` when sparse blocks are given.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.subspace.sparse import SparseLexical
from esp_retrieval.training.display_text import repair_display
from esp_retrieval.training.model import ESPModel


def encoder_section(model: ESPModel, *, trunk_name: str | None = None) -> dict[str, Any]:
    """What the manifest says about the query encoder (the folder holds the full config)."""
    cfg = model.encoder_config()
    return {
        "path": "encoder",
        "format": cfg["format"],
        "format_version": cfg["format_version"],
        "architecture": cfg["architecture"],
        "trunk": trunk_name,
        "trunk_mode": str(model.trunk.mode),
        "pooling": cfg["pooling"],
        "max_length": cfg["max_length"],
        "adapter": cfg["adapter"],
        "objectives": cfg["objectives"],
        "intent_classes": model.intent_classes,
    }


def export_bundle(
    out: str | Path,
    model: ESPModel,
    ids: Sequence[str],
    texts: Sequence[str] | None = None,
    *,
    embeddings: np.ndarray | None = None,
    docs: Iterable[Mapping[str, Any]] | None = None,
    training: Mapping[str, Any] | None = None,
    data_hashes: Mapping[str, str] | None = None,
    metrics: Mapping[str, Any] | None = None,
    operating_points: Mapping[str, Any] | None = None,
    trunk_name: str | None = None,
    dtype: str = "float32",
    batch_size: int = 64,
    overwrite: bool = False,
    sparse: Mapping[str, SparseLexical] | None = None,
    sparse_weights: Mapping[str, float] | None = None,
) -> Path:
    """Write a bundle at ``out`` from ``model`` and a corpus; return its path.

    Give either ``texts`` (embedded here with ``model.encode``) or ``embeddings`` ``(N, D)``
    computed by the same model. ``docs`` (display payload per row) defaults to ``{"text": t}``;
    their display fields (text, title) are repaired by ftfy whoever gave them
    (:mod:`esp_retrieval.training.display_text`; the embedded text is ``t`` as given). ``sparse``: sparse
    blocks over the same rows (``sparse/<name>/``, their default weights ``sparse_weights``).
    """
    if embeddings is None:
        if texts is None:
            raise ValueError("export_bundle needs texts or embeddings")
        embeddings = model.encode(list(texts), batch_size=batch_size)
    emb = normalize_blocks(np.asarray(embeddings, dtype=np.float32), model.layout).astype(dtype)
    if docs is None and texts is not None:
        docs = ({"text": t} for t in texts)
    if docs is not None:  # the trainer's export passes its own docs: repaired all the same
        docs = (repair_display(d)[0] for d in docs)  # display only: embedded as given
    sections = {
        "encoder": encoder_section(model, trunk_name=trunk_name),
        "training": {
            "config": dict(training or {}),
            "data_hashes": dict(data_hashes or {}),
            "final_metrics": dict(metrics or {}),
        },
        "operating_points": dict(operating_points or {}),
    }
    with tempfile.TemporaryDirectory(prefix="esp-encoder-") as tmp:
        enc_dir = model.save_encoder(Path(tmp) / "encoder")
        return write_bundle(
            out,
            model.layout,
            emb,
            list(ids),
            docs=docs,
            encoder_dir=enc_dir,
            sections=sections,
            overwrite=overwrite,
            sparse=sparse,
            sparse_weights=sparse_weights,
        )
