"""``esp index --engine ray``: a corpus encoded by a Ray cluster into a bundle, resumably.

The same result as :func:`esp_retrieval.training.indexing.index_corpus` (the single-process path, the
default), spread over a Ray cluster (``--address``, ``RAY_ADDRESS``, or a local one):

1. **Read** with Ray Data: :class:`CorpusDatasource` (a Ray ``FileBasedDatasource``, so a path
   is a local file or folder or any fsspec/pyarrow URL, ``.gz`` read as a stream) parses each
   file with the single-process parser (:func:`esp_retrieval.training.data.corpus.parse_lines`; Parquet rows
   through :func:`~esp_retrieval.training.data.corpus.record_doc`), so a bad line stops the run with the same
   ``file:line: ...`` message. Empty texts are skipped and counted; the non-empty documents of
   file ``f`` are cut into shards of ``shard_size`` (one output block each).
2. **Encode** in ``map_batches`` actors (:class:`EncodeShards`; a fixed pool, one encoder load
   per actor; one GPU per actor when the cluster has GPUs, else ``threads`` CPUs). Each actor
   writes what it encoded as a piece of its shard: ``<shard>.<first>.npy`` (float32 rows),
   ``<shard>.<first>.json`` (ids, line numbers, display docs) and, last, the marker
   ``<shard>.<first>.done.json`` with both files' sha256 and the counts.
3. **Assemble** on the driver: every file's plan (documents, shards) must be covered by
   checksummed pieces; ids unique over all files; rows in file order; then
   :func:`esp_retrieval.subspace.bundle.write_bundle` (float16 as in the single-process path).

Resumable: the work folder (``--work-dir``, default ``<out>.shards``; on a multi-node cluster a
path every node sees) keeps finished shards; a rerun skips them (their rows are parsed, not
encoded) and removes pieces of unfinished ones. It refuses a work folder of another run
(source bundle, corpus, shard size). It is removed after the bundle is written unless kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.subspace.atomic import atomic_write_bytes, atomic_write_text
from esp_retrieval.subspace.bundle import sha256_file
from esp_retrieval.training.data.corpus import (
    JSONL_SUFFIXES,
    TSV_SUFFIXES,
    CorpusError,
    Doc,
    parse_lines,
    record_doc,
)
from esp_retrieval.training.display_text import repair_display
from esp_retrieval.training.indexing import log_counts, open_source, write_spilled

log = logging.getLogger(__name__)

WORK_FORMAT = 1
PARQUET_SUFFIXES = (".parquet", ".pq")
CORPUS_EXTENSIONS = [s.lstrip(".") + gz for s in (*TSV_SUFFIXES, *JSONL_SUFFIXES) for gz in ("", ".gz")] + [
    s.lstrip(".") for s in PARQUET_SUFFIXES
]


def file_format(path: str) -> str:
    """``tsv``, ``jsonl`` or ``parquet`` from the name (``.gz`` allowed for the text formats)."""
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    base = name.removesuffix(".gz")
    if base.endswith(TSV_SUFFIXES):
        return "tsv"
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    raise CorpusError(
        f"{path}: unknown corpus format; use .tsv (id<TAB>text), .jsonl (optionally .gz) or .parquet"
    )


def shard_key(file_index: int, shard_no: int) -> str:
    return f"f{file_index:05d}-s{shard_no:07d}"


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- 1. reading ---------------------------------------------------------------------------------


def _ray_datasource_base() -> type:
    from ray.data.datasource import FileBasedDatasource

    return FileBasedDatasource


class _Lines:
    """Byte lines of a pyarrow input stream (``f.readline`` is not on every NativeFile)."""

    def __init__(self, f: Any, chunk: int = 1 << 20) -> None:
        self.f, self.chunk = f, chunk

    def __iter__(self) -> Iterator[bytes]:
        rest = b""
        while True:
            data = self.f.read(self.chunk)
            if not data:
                break
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line + b"\n"
        if rest:
            yield rest


def parse_file(f: Any, name: str, fmt: str) -> Iterator[Doc]:
    """Documents of one open corpus stream, checked as the single-process reader checks them."""
    if fmt != "parquet":
        yield from parse_lines(_Lines(f), name, fmt)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.ParquetFile(pa.BufferReader(f.readall()))
    seen: dict[str, int] = {}
    n = 0
    for batch in table.iter_batches(batch_size=8192):
        for row in batch.to_pylist():
            n += 1
            doc = record_doc(row, name, n)
            if doc.id in seen:
                raise CorpusError(f"{name}:{n}: duplicate id {doc.id!r} (first on row {seen[doc.id]})")
            seen[doc.id] = n
            yield doc


def make_datasource(
    paths: str | list[str], *, shard_size: int, done: frozenset[str], work: str, names: dict[str, str]
) -> Any:
    """The Ray Data source of a corpus (built lazily: Ray is imported only here)."""
    base = _ray_datasource_base()

    class CorpusDatasource(base):  # type: ignore[misc, valid-type]
        """Each corpus file parsed by one read task into blocks of one shard each (see module doc)."""

        def __init__(self) -> None:
            super().__init__(paths, file_extensions=CORPUS_EXTENSIONS)
            self.index = {p: i for i, p in enumerate(sorted(self._paths()))}

        def files(self) -> list[str]:
            return sorted(self.index, key=self.index.__getitem__)

        def _read_stream(self, f: Any, path: str) -> Iterator[Any]:
            import pyarrow as pa

            i, name = self.index[path], names.get(path, path)
            fmt = file_format(path)
            rows: list[Doc] = []
            counts = {"documents": 0, "skipped_empty": 0, "shards": 0}

            def block(docs: list[Doc]) -> Any:
                key, first = shard_key(i, counts["shards"]), counts["documents"] - len(docs)
                return pa.table({
                    "shard": [key] * len(docs),
                    "ordinal": list(range(first, first + len(docs))),
                    "shard_rows": [len(docs)] * len(docs),
                    "line": [d.line for d in docs],
                    "id": [d.id for d in docs],
                    "text": [d.text for d in docs],
                    "display": [json.dumps(d.display, ensure_ascii=False, default=str) for d in docs],
                })

            for doc in parse_file(f, name, fmt):
                if not doc.text.strip():
                    counts["skipped_empty"] += 1
                    continue
                rows.append(doc)
                counts["documents"] += 1
                if len(rows) == shard_size:
                    if shard_key(i, counts["shards"]) not in done:
                        yield block(rows)
                    counts["shards"] += 1
                    rows = []
            if rows:
                if shard_key(i, counts["shards"]) not in done:
                    yield block(rows)
                counts["shards"] += 1
            plan = {"file": i, "path": name, **counts}
            atomic_write_text(Path(work) / "files" / f"{i:05d}.json", json.dumps(plan))

    return CorpusDatasource()


# --- 2. encoding --------------------------------------------------------------------------------


class EncodeShards:
    """A ``map_batches`` actor: loads the bundle's encoder once, encodes and writes shard pieces."""

    def __init__(self, encoder_dir: str, work: str, threads: int | None, encode_batch: int) -> None:
        import ray

        from esp_retrieval.encoder.query_encoder import QueryEncoder

        device = "cuda" if ray.get_gpu_ids() else "cpu"
        self.enc = QueryEncoder.load(encoder_dir, device=device, threads=threads)
        self.shards = Path(work) / "shards"
        self.encode_batch = encode_batch

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keys, ordinals = batch["shard"], batch["ordinal"]
        out: dict[str, list[Any]] = {"shard": [], "documents": []}
        start = 0
        n = len(keys)
        while start < n:  # a batch holds whole shards (CPU) or any slices of them (GPU batching)
            stop = start + 1
            while stop < n and keys[stop] == keys[start] and ordinals[stop] == ordinals[stop - 1] + 1:
                stop += 1
            self._write(batch, start, stop)
            out["shard"].append(str(keys[start]))
            out["documents"].append(stop - start)
            start = stop
        return {k: np.asarray(v) for k, v in out.items()}

    def _write(self, batch: dict[str, np.ndarray], start: int, stop: int) -> None:
        enc = self.enc
        texts = [str(t) for t in batch["text"][start:stop]]
        lengths = enc.tokenizer(texts, truncation=False, add_special_tokens=True)["input_ids"]
        vecs = enc.encode_documents(texts, batch_size=self.encode_batch)
        vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        row0 = int(batch["ordinal"][start])  # the piece's first document in its file's order
        stem = f"{batch['shard'][start]}.{row0:09d}"
        import io

        buf = io.BytesIO()
        np.save(buf, vecs, allow_pickle=False)
        emb = buf.getvalue()
        meta = json.dumps({
            "ids": [str(x) for x in batch["id"][start:stop]],
            "lines": [int(x) for x in batch["line"][start:stop]],
            # display text repaired exactly as the single-process path does; the embedded text is not
            "docs": [repair_display({"text": t, **json.loads(str(d))})[0]
                     for t, d in zip(texts, batch["display"][start:stop], strict=True)],
        }, ensure_ascii=False).encode("utf-8")
        atomic_write_bytes(self.shards / f"{stem}.npy", emb)
        atomic_write_bytes(self.shards / f"{stem}.json", meta)
        marker = {
            "shard": str(batch["shard"][start]),
            "row0": row0,
            "documents": stop - start,
            "shard_rows": int(batch["shard_rows"][start]),
            "truncated": int(sum(len(x) > enc.max_length for x in lengths)),
            "files": {f"{stem}.npy": _sha256_bytes(emb), f"{stem}.json": _sha256_bytes(meta)},
        }
        atomic_write_text(self.shards / f"{stem}.done.json", json.dumps(marker))


# --- 3. the run and the assembly ----------------------------------------------------------------


def _pieces(shards_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Finished pieces per shard key (markers only: a piece without its marker is unfinished)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in sorted(shards_dir.glob("*.done.json")):
        marker = json.loads(m.read_text("utf-8"))
        out.setdefault(marker["shard"], []).append(marker)
    for v in out.values():
        v.sort(key=lambda x: x["row0"])
    return out


def _complete(key: str, pieces: list[dict[str, Any]], shard_size: int) -> bool:
    """The pieces cover every document of shard ``key``, in order, with no gap or overlap."""
    if not pieces:
        return False
    at = int(key.rsplit("-s", 1)[1]) * shard_size
    for p in pieces:
        if p["row0"] != at:
            return False
        at += p["documents"]
    return at - pieces[0]["row0"] == pieces[0]["shard_rows"] and pieces[0]["row0"] == int(
        key.rsplit("-s", 1)[1]) * shard_size


def _shard_sizes(plans: dict[int, dict[str, Any]], shard_size: int) -> dict[str, int]:
    sizes = {}
    for i, plan in plans.items():
        for s in range(plan["shards"]):
            sizes[shard_key(i, s)] = min(shard_size, plan["documents"] - s * shard_size)
    return sizes


def _read_plans(work: Path) -> dict[int, dict[str, Any]]:
    return {
        int(p.stem): json.loads(p.read_text("utf-8")) for p in sorted((work / "files").glob("*.json"))
    }


def prepare_work(work: Path, identity: dict[str, Any], shard_size: int) -> tuple[frozenset[str], int]:
    """Create or resume the work folder; return the finished shard keys and drop unfinished pieces."""
    run = work / "run.json"
    if run.exists():
        have = json.loads(run.read_text("utf-8"))
        if have != identity:
            raise CorpusError(
                f"{work}: the work folder holds shards of another run (source bundle, corpus or shard "
                f"size differ); remove it or pass another --work-dir"
            )
    else:
        (work / "shards").mkdir(parents=True, exist_ok=True)
        (work / "files").mkdir(parents=True, exist_ok=True)
        atomic_write_text(run, json.dumps(identity))
    (work / "shards").mkdir(parents=True, exist_ok=True)
    (work / "files").mkdir(parents=True, exist_ok=True)
    pieces = _pieces(work / "shards")
    done = frozenset(k for k, v in pieces.items() if _complete(k, v, shard_size))
    for f in (work / "shards").iterdir():  # unfinished shards are encoded again, whole
        if f.name.split(".", 1)[0] not in done:
            f.unlink()
    return done, sum(1 for _ in done)


def _init_ray(address: str | None) -> bool:
    """Connect (``address``, else ``RAY_ADDRESS``) or start a local cluster; True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(
        address=address or os.environ.get("RAY_ADDRESS") or None,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        configure_logging=True,
    )
    return True


def index_corpus_ray(
    src_bundle: str | Path,
    corpus: str | Path,
    out: str | Path,
    *,
    batch_size: int = 256,
    dtype: str = "float32",
    overwrite: bool = False,
    progress: bool = True,
    threads: int | None = None,
    address: str | None = None,
    actors: int | None = None,
    shard_size: int = 4096,
    work_dir: str | Path | None = None,
    keep_work: bool = False,
) -> dict[str, Any]:
    """:func:`esp_retrieval.training.indexing.index_corpus` on a Ray cluster; return a summary.

    ``actors``: encoder actors (default: one per GPU, else one per ``threads`` CPUs of the
    cluster). ``batch_size``: texts per forward pass inside an actor (the encoder's batch, at
    most 64 as in the single-process path).
    """
    import ray
    from tqdm.auto import tqdm

    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    # the encoder here serves the layout check and max_length: the actors encode
    src, enc = open_source(src_bundle, out, dtype=dtype, overwrite=overwrite)
    corpus_s = str(corpus)
    local = "://" not in corpus_s
    if local and not Path(corpus_s).exists():
        raise CorpusError(f"{corpus_s}: no such file")
    if local and Path(corpus_s).is_file():
        file_format(corpus_s)
    work = Path(work_dir) if work_dir is not None else Path(f"{out}.shards")
    identity = {"format": WORK_FORMAT, "source_bundle": src.version, "corpus": corpus_s,
                "shard_size": shard_size}
    done, reused = prepare_work(work, identity, shard_size)
    started = _init_ray(address)
    t0 = time.perf_counter()
    try:
        from ray.data import ActorPoolStrategy, DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        resolved = str(Path(corpus_s).resolve()) if local else corpus_s
        names = {resolved: corpus_s}
        source = make_datasource(resolved, shard_size=shard_size, done=done, work=str(work), names=names)
        files = source.files()
        gpus = int(ray.cluster_resources().get("GPU", 0))
        cpus = int(ray.cluster_resources().get("CPU", 1))
        per_actor = threads or 1
        n_actors = actors or (gpus if gpus else max(1, cpus // per_actor))
        # parsing is light next to encoding: read tasks take no CPU slot, so a pool that fills the
        # cluster's CPUs cannot starve its own input
        read = ray.data.read_datasource(source, num_cpus=0, concurrency=max(1, min(len(files), cpus)))
        ds = read.map_batches(
            EncodeShards,
            fn_constructor_kwargs={
                "encoder_dir": str(src.encoder_dir),
                "work": str(work),
                "threads": per_actor,
                "encode_batch": min(64, batch_size),
            },
            batch_size=shard_size if gpus else None,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=n_actors),
            num_gpus=1 if gpus else None,
            num_cpus=None if gpus else per_actor,
        )
        encoded = 0
        with tqdm(desc="index (ray)", unit="doc", disable=not progress, mininterval=1.0) as bar:
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                n = int(np.sum(batch["documents"]))
                encoded += n
                bar.update(n)
    except Exception as exc:
        cause = _corpus_error(exc)
        if cause is not None:
            raise CorpusError(cause.message, cause.field) from None
        raise
    finally:
        if started:
            ray.shutdown()
    encode_s = time.perf_counter() - t0
    summary = _assemble(src, work, files, corpus_s, Path(out), shard_size=shard_size, dtype=dtype,
                        overwrite=overwrite)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    log_counts(summary, enc.max_length)
    return {
        **summary,
        "engine": "ray",
        "actors": n_actors,
        "gpus_per_actor": 1 if gpus else 0,
        "shards_reused": reused,
        "documents_encoded": encoded,
        "encode_s": round(encode_s, 3),
    }


def _corpus_error(exc: BaseException) -> CorpusError | None:
    """The :class:`CorpusError` a read task raised, through Ray's wrappers."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CorpusError):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return None


def _assemble(
    src: Any, work: Path, files: list[str], corpus: str, out: Path, *, shard_size: int, dtype: str,
    overwrite: bool,
) -> dict[str, Any]:
    plans = _read_plans(work)
    missing = [f for i, f in enumerate(files) if i not in plans]
    if missing:
        raise CorpusError(f"{missing[0]}: the file was not read to its end")
    sizes = _shard_sizes(plans, shard_size)
    pieces = _pieces(work / "shards")
    for key, size in sizes.items():
        got = pieces.get(key, [])
        if not _complete(key, got, shard_size) or got[0]["shard_rows"] != size:
            raise CorpusError(f"{work}: shard {key} is incomplete; rerun to encode it")
    total = sum(sizes.values())
    if total == 0:
        raise CorpusError(f"{corpus}: no documents with text to index")
    ids: list[str] = []
    where: dict[str, tuple[str, int]] = {}
    truncated = 0
    with tempfile.TemporaryDirectory(prefix="esp-index-ray-", dir=work) as tmp:
        raw = Path(tmp) / "emb.f32"
        docs_path = Path(tmp) / "docs.jsonl"
        with raw.open("wb") as emb_fh, docs_path.open("w", encoding="utf-8") as docs_fh:
            for key in sorted(sizes):
                plan = plans[int(key[1:6])]
                for p in pieces[key]:
                    for name, sha in p["files"].items():
                        if sha256_file(work / "shards" / name) != sha:
                            raise CorpusError(f"{work / 'shards' / name}: checksum mismatch; rerun")
                    stem = next(iter(p["files"])).removesuffix(".npy")
                    vecs = np.load(work / "shards" / f"{stem}.npy", allow_pickle=False)
                    meta = json.loads((work / "shards" / f"{stem}.json").read_text("utf-8"))
                    if vecs.shape != (p["documents"], src.layout.dim) or vecs.dtype != np.float32:
                        raise CorpusError(f"{work / 'shards' / stem}.npy: shape {vecs.shape} {vecs.dtype}")
                    for doc_id, line in zip(meta["ids"], meta["lines"], strict=True):
                        if doc_id in where:
                            f0, l0 = where[doc_id]
                            raise CorpusError(
                                f"{plan['path']}:{line}: duplicate id {doc_id!r} (first in {f0}:{l0})"
                            )
                        where[doc_id] = (plan["path"], line)
                        ids.append(doc_id)
                    emb_fh.write(vecs.tobytes())
                    for d in meta["docs"]:
                        docs_fh.write(json.dumps(d, ensure_ascii=False) + "\n")
                    truncated += p["truncated"]
        counts = {
            "documents": len(ids),
            "skipped_empty": sum(p["skipped_empty"] for p in plans.values()),
            "truncated": truncated,
        }
        index = {"source_bundle": src.version, "corpus": corpus.rstrip("/").rsplit("/", 1)[-1],
                 "engine": "ray", "shards": len(sizes), **counts}
        path = write_spilled(src, out, raw, docs_path, ids, index=index, dtype=dtype, overwrite=overwrite)
    return {"bundle": str(path), **counts, "shards": len(sizes)}
