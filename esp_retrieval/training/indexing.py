"""Build a bundle for any corpus with the query encoder of an existing bundle (``esp index``).

Streamed: documents are read, embedded and spilled to temporary files batch by batch, so
memory holds one batch plus the id list. Empty (whitespace-only) texts are skipped and
counted — there is nothing to embed and no query could match them. Texts longer than the
encoder's ``max_length`` tokens are truncated exactly as queries are (the usual bi-encoder
behaviour) and counted. Both counts land in the manifest's ``index`` section and the log.
The display text written to ``docs.jsonl`` is repaired with ftfy (``display_repaired`` counts
the documents it changed); the text embedded is the corpus's own (:mod:`esp_retrieval.training.display_text`).
The new bundle keeps the source bundle's encoder, layout and operating points.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from esp_retrieval.subspace.bundle import Bundle, read_bundle, write_bundle
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.training.data.corpus import CorpusError, Doc, read_corpus
from esp_retrieval.training.display_text import repair_display

if TYPE_CHECKING:
    from esp_retrieval.encoder.query_encoder import QueryEncoder

log = logging.getLogger(__name__)


def index_corpus(
    src_bundle: str | Path,
    corpus: str | Path,
    out: str | Path,
    *,
    batch_size: int = 256,
    dtype: str = "float32",
    overwrite: bool = False,
    progress: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:
    """Embed ``corpus`` with ``src_bundle``'s encoder and write a bundle at ``out``; return a summary."""
    from tqdm.auto import tqdm

    src, enc = open_source(src_bundle, out, dtype=dtype, overwrite=overwrite, threads=threads)
    counts = {"documents": 0, "skipped_empty": 0, "truncated": 0, "display_repaired": 0}
    ids: list[str] = []
    with tempfile.TemporaryDirectory(prefix="esp-index-") as tmp:
        raw = Path(tmp) / "emb.f32"
        docs_path = Path(tmp) / "docs.jsonl"
        with (
            raw.open("wb") as emb_fh,
            docs_path.open("w", encoding="utf-8") as docs_fh,
            tqdm(desc="index", unit="doc", disable=not progress, mininterval=1.0) as bar,
        ):
            for batch in _batches(read_corpus(corpus), batch_size, counts):
                texts = [d.text for d in batch]
                lengths = enc.tokenizer(texts, truncation=False, add_special_tokens=True)["input_ids"]
                counts["truncated"] += sum(len(x) > enc.max_length for x in lengths)
                vecs = enc.encode_documents(texts, batch_size=min(64, batch_size)).astype(np.float32)
                emb_fh.write(np.ascontiguousarray(vecs).tobytes())
                for d in batch:
                    ids.append(d.id)
                    shown, repaired = repair_display({"text": d.text, **d.display})  # display only
                    counts["display_repaired"] += repaired
                    docs_fh.write(json.dumps(shown, ensure_ascii=False) + "\n")
                counts["documents"] += len(batch)
                bar.update(len(batch))
        if not ids:
            raise CorpusError(f"{corpus}: no documents with text to index")
        index = {"source_bundle": src.version, "corpus": Path(corpus).name, **counts}
        path = write_spilled(src, out, raw, docs_path, ids, index=index, dtype=dtype, overwrite=overwrite)
    log_counts(counts, enc.max_length)
    return {"bundle": str(path), **counts}


def open_source(
    src_bundle: str | Path, out: str | Path, *, dtype: str, overwrite: bool, threads: int | None = None
) -> tuple[Bundle, QueryEncoder]:
    """The checks both indexing paths make first: the source bundle (read with every check) and
    its query encoder (same layout), a valid ``dtype``, and ``out`` free unless ``overwrite``."""
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    src = read_bundle(src_bundle)
    if src.encoder_dir is None:
        raise CorpusError(f"{src_bundle}: the bundle has no encoder/ folder to index with")
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype {dtype!r} is invalid; allowed: 'float32', 'float16'")
    if Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    enc = QueryEncoder.load(src.encoder_dir, threads=threads)
    if enc.layout != src.layout:
        raise CorpusError(f"{src_bundle}: the encoder's layout differs from the bundle's")
    return src, enc


def write_spilled(
    src: Bundle,
    out: str | Path,
    raw: Path,
    docs_path: Path,
    ids: list[str],
    *,
    index: dict[str, Any],
    dtype: str,
    overwrite: bool,
) -> Path:
    """Write the bundle of the spilled rows (``raw``: float32 rows, ``docs_path``: one JSON
    document a line, both in ``ids`` order) with ``src``'s encoder, layout and operating
    points, and ``index`` as the manifest's ``index`` section (``dtype="float16"``: the rows
    block-normalised, then cast)."""
    emb: np.ndarray = np.memmap(raw, dtype=np.float32, mode="r", shape=(len(ids), src.layout.dim))
    if dtype == "float16":
        emb = normalize_blocks(np.asarray(emb), src.layout).astype(np.float16)

    def docs() -> Iterator[dict[str, Any]]:
        with docs_path.open(encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)

    keep = {k: v for k, v in src.manifest.items() if k in ("encoder", "training", "operating_points")}
    keep["index"] = index
    return write_bundle(
        out, src.layout, emb, ids, docs=docs(), encoder_dir=src.encoder_dir, sections=keep,
        overwrite=overwrite,
    )


def log_counts(counts: Mapping[str, int], max_length: int) -> None:
    """Warn about the documents skipped (empty text) and truncated (past ``max_length`` tokens)."""
    if counts["skipped_empty"]:
        log.warning("skipped %d documents with empty text", counts["skipped_empty"])
    if counts["truncated"]:
        log.warning(
            "%d documents were longer than %d tokens and were truncated", counts["truncated"], max_length
        )


def _batches(docs: Iterator[Doc], size: int, counts: dict[str, int]) -> Iterator[list[Doc]]:
    batch: list[Doc] = []
    for d in docs:
        if not d.text.strip():
            counts["skipped_empty"] += 1
            continue
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
