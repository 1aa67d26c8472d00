"""The weight-aware inverted-file index: build, save and load (npy + json, no pickle).

An index holds several **partitions** of the same corpus. Each partition is a coarse k-means
clustering over a group of layout blocks (by default: all blocks together, plus one per block),
so a request whose weights favour one block has a partition whose lists follow that block's
geometry. Every list of every partition is summarised for *any* weight vector by

* ``means``: the mean of every column over the list (``(L, D)``), so the list's mean weighted
  score is ``<concat_k(w_k q_k), mean>`` exactly;
* ``variances``: the per-column variance over the list (``(L, D)``), for the spread of the
  weighted score (a diagonal model, used only to order and stop the probing);
* ``radii``: per block, the largest distance of a member's block from the list's block mean
  (``(L, K)``), so ``sum_k w_k (<q_k, mean_k> + |q_k| r_k)`` bounds every member's score from
  above: lists that cannot reach the current k-th score are skipped with a guarantee.

Each partition stores its rows in list order as codes (``int8``: ``round(x * scale)`` with
one scale per column, or ``float32``) so a probed list is one contiguous block; the float32
(or float16) master stays the bundle's ``embeddings.npy`` and every hit is re-ranked on it.

On disk (a folder, e.g. ``ann/`` inside a bundle): ``ivf.json`` (format, layout, sizes,
build parameters and report, per-file sha256) and one ``.npy`` per array. :func:`load_index`
refuses a folder whose files are missing, altered, of the wrong shape or dtype, inconsistent
(offsets, row permutation) or built for another corpus, with an :class:`IvfIndexError` naming
the file. Section references: docs/architecture.md sections 1 (the score) and 4 (bundle).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.atomic import atomic_dir, atomic_open, atomic_write_text
from esp_retrieval.subspace.bundle import (
    MANIFEST,
    BundleError,
    content_version,
    json_default,
    read_bundle,
    sha256_file,
)
from esp_retrieval.subspace.layout import LayoutError, SubspaceLayout

FORMAT = "esp-ivf"
FORMAT_VERSION = 1
INDEX_JSON = "ivf.json"
LIST_DTYPES: dict[str, Any] = {"int8": np.int8, "float32": np.float32}
_CHUNK = 65536
_ARRAYS = ("order", "offsets", "codes", "means", "variances", "radii")


class IvfIndexError(BundleError):
    """An index that cannot be built or used; the message names the file or parameter (a
    :class:`~esp_retrieval.subspace.bundle.BundleError`: a bundle whose index is bad is refused like one
    whose embeddings are)."""


@dataclass(frozen=True)
class IvfParams:
    """How to build an index.

    ``groups``: partitions as lists of block names (``None``: one partition over all blocks
    together; e.g. ``(("semantic", "entity", "intent"), ("intent",))`` adds an intent one);
    ``nlist``: lists per partition (``None``: ``sqrt(N)`` rounded, at least 1, at most ``N``);
    ``list_dtype``: ``int8`` or ``float32`` codes; ``train_rows``: k-means sample rows per
    list; ``iters``: k-means iterations (``faiss.Kmeans``, seeded by ``seed``).
    """

    groups: tuple[tuple[str, ...], ...] | None = None
    nlist: int | None = None
    list_dtype: str = "int8"
    train_rows: int = 48
    iters: int = 10
    seed: int = 0

    def resolve_groups(self, layout: SubspaceLayout) -> tuple[tuple[str, ...], ...]:
        if self.groups is None:
            return (tuple(layout.names),)
        out = []
        for i, g in enumerate(self.groups):
            if not g:
                raise IvfIndexError(f"groups[{i}] is empty", "groups")
            for name in g:
                if name not in layout:
                    raise IvfIndexError(
                        f"groups[{i}] names block {name!r}; the layout has {list(layout.names)}", "groups"
                    )
            out.append(tuple(g))
        if not out:
            raise IvfIndexError("groups is empty: at least one partition is required", "groups")
        return tuple(out)


@dataclass(frozen=True)
class Partition:
    """One coarse clustering: ``L`` lists over the rows, in list order."""

    blocks: tuple[str, ...]
    order: np.ndarray  # (N,) int64 corpus row of each stored position
    offsets: np.ndarray  # (L + 1,) int64: list j holds positions offsets[j]:offsets[j+1]
    codes: np.ndarray  # (N, D) int8 or float32, rows in list order
    means: np.ndarray  # (L, D) float32
    variances: np.ndarray  # (L, D) float32
    radii: np.ndarray  # (L, K) float64, rounded up

    @property
    def nlist(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        return int(sum(getattr(self, a).nbytes for a in _ARRAYS))


@dataclass(frozen=True)
class IvfIndex:
    layout: SubspaceLayout
    num_docs: int
    list_dtype: str
    scale: np.ndarray  # (D,) float32: codes = round(x * scale); ones for float32 codes
    partitions: tuple[Partition, ...]
    report: dict[str, Any] = field(default_factory=dict)  # build parameters, seconds, bytes

    @property
    def dim(self) -> int:
        return self.layout.dim

    @property
    def nbytes(self) -> int:
        return int(self.scale.nbytes + sum(p.nbytes for p in self.partitions))


# --- build --------------------------------------------------------------------------------
def _rows32(corpus: np.ndarray, start: int, stop: int) -> np.ndarray:
    return np.asarray(corpus[start:stop], dtype=np.float32)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise IvfIndexError(
            "building an ivf index needs faiss (the faiss-cpu package) for its k-means", "faiss"
        ) from exc
    return faiss


def kmeans(x: np.ndarray, nlist: int, iters: int, seed: int) -> Any:
    """``faiss.Kmeans`` on ``x`` ``(n, d)`` float32, seeded: the trained quantiser (its
    ``centroids`` ``(nlist, d)`` and the flat L2 ``index`` that assigns rows to them).

    k-means++ seeding where this faiss has it (random rows otherwise); faiss splits an emptied
    cluster. ``x`` is already the build's seeded sample, so faiss does not subsample it again.
    """
    faiss = _faiss()
    n, d = x.shape
    opts: dict[str, Any] = {
        "niter": iters,
        "seed": int(seed),
        "min_points_per_centroid": 1,
        "max_points_per_centroid": max(1, -(-n // nlist)),
        "verbose": False,
    }
    init = getattr(faiss, "ClusteringInitMethod_KMEANS_PLUS_PLUS", None)
    if init is not None:
        opts["init_method"] = init
    km = faiss.Kmeans(d, nlist, **opts)
    km.train(np.ascontiguousarray(x, dtype=np.float32))
    return km


def _assign(quantiser: Any, x: np.ndarray) -> np.ndarray:
    """Nearest centroid (Euclidean) of each row of ``x``, by the quantiser's flat index."""
    _, labels = quantiser.index.search(np.ascontiguousarray(x, dtype=np.float32), 1)
    return labels[:, 0].astype(np.int64)


def _list_sums(x: np.ndarray, labels: np.ndarray, nlist: int) -> np.ndarray:
    """``(nlist, d)`` float64: the sum of the rows of ``x`` ``(n, d)`` per label, as one sparse
    one-hot product (rows in any order; float32 products, float64 totals across chunks)."""
    onehot = sp.csr_matrix(
        (np.ones(len(labels), np.float32), (labels, np.arange(len(labels)))), shape=(nlist, len(labels))
    )
    return np.asarray(onehot @ x, dtype=np.float64)


def _quantise(x: np.ndarray, scale: np.ndarray, dtype: Any) -> np.ndarray:
    if dtype == np.float32:
        return x
    return np.clip(np.rint(x * scale), -127, 127).astype(np.int8)


def build_index(corpus: np.ndarray, layout: SubspaceLayout, params: IvfParams | None = None) -> IvfIndex:
    """Build every partition from ``corpus`` ``(N, D)`` (float32/float16, may be memory-mapped)."""
    params = params or IvfParams()
    if params.list_dtype not in LIST_DTYPES:
        raise IvfIndexError(
            f"list_dtype {params.list_dtype!r} is unknown; allowed: {list(LIST_DTYPES)}", "list_dtype"
        )
    n, d = corpus.shape
    if d != layout.dim:
        raise IvfIndexError(f"corpus has {d} columns, the layout has {layout.dim}", "corpus")
    groups = params.resolve_groups(layout)
    nlist = params.nlist if params.nlist is not None else max(1, round(n**0.5))
    if isinstance(nlist, bool) or not isinstance(nlist, int) or nlist < 1:
        raise IvfIndexError(f"nlist must be an integer >= 1, got {nlist!r}", "nlist")
    nlist = min(nlist, n)
    t0 = time.perf_counter()
    rng = np.random.default_rng(params.seed)
    dtype = LIST_DTYPES[params.list_dtype]
    peak = np.zeros(d, np.float32)
    for s in range(0, n, _CHUNK):
        np.maximum(peak, np.abs(_rows32(corpus, s, s + _CHUNK)).max(axis=0), out=peak)
    if not np.isfinite(peak).all():
        raise IvfIndexError("corpus contains NaN or infinite values", "corpus")
    scale = (
        np.where(peak > 0, 127.0 / np.maximum(peak, 1e-30), 1.0).astype(np.float32)
        if dtype == np.int8
        else np.ones(d, np.float32)
    )
    sample_n = min(n, max(nlist, params.train_rows * nlist))
    sample_rows = np.sort(rng.choice(n, size=sample_n, replace=False))
    sample = np.asarray(corpus[sample_rows], dtype=np.float32)
    indicator32 = layout.indicator(np.float32)
    parts = []
    timings = []
    for group in groups:
        tp = time.perf_counter()
        cols = np.concatenate([np.arange(layout[b].offset, layout[b].end) for b in group])
        quantiser = kmeans(sample[:, cols], nlist, params.iters, int(rng.integers(2**31 - 1)))
        labels = np.concatenate(
            [_assign(quantiser, _rows32(corpus, s, s + _CHUNK)[:, cols]) for s in range(0, n, _CHUNK)]
        )
        order = np.argsort(labels, kind="stable").astype(np.int64)
        position = np.empty(n, np.int64)
        position[order] = np.arange(n)
        counts = np.bincount(labels, minlength=nlist)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # pass 1 (corpus order, sequential reads): the list means
        sums = np.zeros((nlist, d), np.float64)
        for s in range(0, n, _CHUNK):
            sums += _list_sums(_rows32(corpus, s, s + _CHUNK), labels[s : s + _CHUNK], nlist)
        cnt = np.maximum(counts, 1)[:, None]
        means: np.ndarray = (sums / cnt).astype(np.float32)
        # pass 2: codes (scattered to their list position), per-column spread and per-block radii
        # about the stored float32 means (the bound needs only that ``radii`` are measured from
        # the very centres the search uses)
        codes = np.empty((n, d), dtype)
        sq_sums = np.zeros((nlist, d), np.float64)
        radii_sq = np.zeros((nlist, len(layout)), np.float64)
        for s in range(0, n, _CHUNK):
            x = _rows32(corpus, s, s + _CHUNK)
            lab = labels[s : s + _CHUNK]
            codes[position[s : s + _CHUNK]] = _quantise(x, scale, dtype)
            dev = x - means[lab]
            np.square(dev, out=dev)
            sq_sums += _list_sums(dev, lab, nlist)
            np.maximum.at(radii_sq, lab, (dev @ indicator32).astype(np.float64))
        variances = (sq_sums / cnt).astype(np.float32)
        # float32 sums of at most max-block-width non-negative terms: relative error below
        # (width + 2) u; rounded up by twice that, so the bound stays a bound
        radii = np.sqrt(radii_sq * (1.0 + 2.0 * (max(layout.dims) + 2) * 2.0**-24)) * (1.0 + 1e-6) + 1e-6
        parts.append(Partition(group, order, offsets, codes, means, variances, radii))
        timings.append(round(time.perf_counter() - tp, 3))
    seconds = time.perf_counter() - t0
    index = IvfIndex(layout, n, params.list_dtype, scale, tuple(parts))
    index.report.update(
        {
            "build_seconds": round(seconds, 3),
            "partition_seconds": timings,
            "bytes": index.nbytes,
            "params": {
                "groups": [list(g) for g in groups],
                "nlist": nlist,
                "list_dtype": params.list_dtype,
                "train_rows": params.train_rows,
                "iters": params.iters,
                "seed": params.seed,
                "kmeans": "faiss",
            },
        }
    )
    return index


# --- save / load --------------------------------------------------------------------------
def corpus_fingerprint(corpus: np.ndarray) -> str:
    """A cheap identity of the corpus an index was built for: shape, dtype, 64 sampled rows."""
    n = corpus.shape[0]
    rows = np.unique(np.linspace(0, n - 1, min(n, 64)).astype(np.int64))
    h = hashlib.sha256(f"{corpus.shape}|{corpus.dtype}".encode())
    h.update(np.ascontiguousarray(np.asarray(corpus[rows])).tobytes())
    return h.hexdigest()


def index_files(index: IvfIndex) -> list[str]:
    """The file names :func:`save_index` writes (``ivf.json`` last)."""
    names = [f"p{i}.{a}.npy" for i in range(len(index.partitions)) for a in _ARRAYS]
    return ["scale.npy", *names, INDEX_JSON]


def save_index(index: IvfIndex, folder: str | os.PathLike[str], corpus: np.ndarray | None = None) -> Path:
    """Write ``index`` into ``folder`` (created); each file atomically, ``ivf.json`` last."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {"scale.npy": index.scale}
    for i, p in enumerate(index.partitions):
        for a in _ARRAYS:
            arrays[f"p{i}.{a}.npy"] = getattr(p, a)
    files = {}
    for name, arr in arrays.items():
        with atomic_open(root / name, "wb") as fh:
            np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
        files[name] = sha256_file(root / name)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "layout": index.layout.to_dict(),
        "num_docs": index.num_docs,
        "list_dtype": index.list_dtype,
        "partitions": [{"blocks": list(p.blocks), "nlist": p.nlist} for p in index.partitions],
        "corpus_fingerprint": corpus_fingerprint(corpus) if corpus is not None else None,
        "report": index.report,
        "files": files,
    }
    atomic_write_text(root / INDEX_JSON, json.dumps(meta, indent=2))
    return root


def _bad(name: str, why: str) -> IvfIndexError:
    return IvfIndexError(f"{name}: {why}", name)


def load_index(
    folder: str | os.PathLike[str],
    corpus: np.ndarray,
    layout: SubspaceLayout,
    *,
    verify_checksums: bool = True,
) -> IvfIndex:
    """Read and check an index written by :func:`save_index` for ``corpus`` and ``layout``.

    Raises :class:`IvfIndexError` naming the file at fault: missing or unlisted files, sha256
    mismatch, wrong format/version, another layout or corpus, wrong shapes or dtypes, offsets
    that do not partition the rows, an ``order`` that is not a permutation, non-finite values.
    """
    root = Path(folder)
    meta_path = root / INDEX_JSON
    if not meta_path.is_file():
        raise _bad(INDEX_JSON, f"missing in {root}")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(INDEX_JSON, f"not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise _bad(INDEX_JSON, "must be a JSON object")
    for key in ("format", "format_version", "layout", "num_docs", "list_dtype", "partitions", "files"):
        if key not in meta:
            raise _bad(INDEX_JSON, f"missing field {key!r}")
    if meta["format"] != FORMAT or meta["format_version"] != FORMAT_VERSION:
        raise _bad(
            INDEX_JSON,
            f"format {meta['format']!r} version {meta['format_version']!r} is not supported "
            f"(this build reads {FORMAT!r} version {FORMAT_VERSION})",
        )
    try:
        stored_layout = SubspaceLayout.from_dict(meta["layout"])
    except (LayoutError, TypeError, KeyError) as exc:
        raise _bad(INDEX_JSON, f"layout is invalid: {exc}") from exc
    if stored_layout.to_dict() != layout.to_dict():
        raise _bad(
            INDEX_JSON,
            f"built for layout {list(stored_layout.names)} {list(stored_layout.dims)}, "
            f"the corpus has {list(layout.names)} {list(layout.dims)}: rebuild the index",
        )
    n, d = int(corpus.shape[0]), layout.dim
    if meta["num_docs"] != n:
        raise _bad(INDEX_JSON, f"built for {meta['num_docs']} rows, the corpus has {n}: rebuild the index")
    fp = meta.get("corpus_fingerprint")
    if fp is not None and fp != corpus_fingerprint(corpus):
        raise _bad(INDEX_JSON, "built for another corpus (fingerprint differs): rebuild the index")
    if meta["list_dtype"] not in LIST_DTYPES:
        raise _bad(INDEX_JSON, f"list_dtype {meta['list_dtype']!r} is unknown; allowed {list(LIST_DTYPES)}")
    parts_meta = meta["partitions"]
    if not isinstance(parts_meta, list) or not parts_meta:
        raise _bad(INDEX_JSON, "partitions must be a non-empty list")
    files = meta["files"]
    if not isinstance(files, dict):
        raise _bad(INDEX_JSON, "files must be an object")
    expected = ["scale.npy"] + [f"p{i}.{a}.npy" for i in range(len(parts_meta)) for a in _ARRAYS]
    for name in expected:
        if name not in files:
            raise _bad(INDEX_JSON, f"files does not list {name}")
    for name in files:
        if name not in expected:
            raise _bad(INDEX_JSON, f"files lists unexpected {name!r}")
        if not (root / name).is_file():
            raise _bad(name, f"listed in {INDEX_JSON} but missing from {root}")

    def arr(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        # read once: the bytes hashed are the bytes loaded (no swap between check and use)
        raw = (root / name).read_bytes()
        if verify_checksums and hashlib.sha256(raw).hexdigest() != files[name]:
            raise _bad(name, "sha256 mismatch (corrupt, truncated or modified file)")
        try:
            a = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise _bad(name, f"unreadable ({exc})") from exc
        if a.shape != shape or a.dtype != np.dtype(dtype):
            raise _bad(name, f"shape {a.shape} dtype {a.dtype}, expected {shape} {np.dtype(dtype)}")
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            raise _bad(name, "contains NaN or infinite values")
        return a

    dtype = LIST_DTYPES[meta["list_dtype"]]
    K = len(layout)
    scale = arr("scale.npy", (d,), np.float32)
    if (scale <= 0).any():
        raise _bad("scale.npy", "scales must be > 0")
    parts = []
    for i, pm in enumerate(parts_meta):
        if not isinstance(pm, dict) or not isinstance(pm.get("nlist"), int) or pm["nlist"] < 1:
            raise _bad(INDEX_JSON, f"partitions[{i}] must be an object with nlist >= 1")
        blocks = pm.get("blocks")
        if not isinstance(blocks, list) or not blocks or any(b not in layout for b in blocks):
            raise _bad(INDEX_JSON, f"partitions[{i}].blocks must name blocks of the layout")
        L = pm["nlist"]
        order = arr(f"p{i}.order.npy", (n,), np.int64)
        offsets = arr(f"p{i}.offsets.npy", (L + 1,), np.int64)
        if offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) < 0).any():
            raise _bad(f"p{i}.offsets.npy", f"offsets must rise from 0 to {n}")
        seen = np.zeros(n, bool)
        if order.min() < 0 or order.max() >= n:
            raise _bad(f"p{i}.order.npy", f"rows must lie in 0..{n - 1}")
        seen[order] = True
        if not seen.all():
            raise _bad(f"p{i}.order.npy", "is not a permutation of the corpus rows")
        codes = arr(f"p{i}.codes.npy", (n, d), dtype)
        means = arr(f"p{i}.means.npy", (L, d), np.float32)
        variances = arr(f"p{i}.variances.npy", (L, d), np.float32)
        radii = arr(f"p{i}.radii.npy", (L, K), np.float64)
        if (variances < 0).any() or (radii < 0).any():
            raise _bad(f"p{i}.radii.npy", "variances and radii must be >= 0")
        parts.append(Partition(tuple(blocks), order, offsets, codes, means, variances, radii))
    report = meta.get("report")
    report = dict(report) if isinstance(report, dict) else {}
    return IvfIndex(layout, n, meta["list_dtype"], scale, tuple(parts), report)


# --- in a bundle ----------------------------------------------------------------------------
BUNDLE_DIR = "ann"  # the index's folder inside a bundle (docs/architecture.md section 4)


def bundle_index_dir(bundle_path: str | os.PathLike[str]) -> Path | None:
    """``<bundle>/ann`` when the bundle carries an index, else ``None``."""
    p = Path(bundle_path) / BUNDLE_DIR
    return p if (p / INDEX_JSON).is_file() else None


def add_index_to_bundle(
    bundle_path: str | os.PathLike[str],
    params: IvfParams | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Build the index of a bundle's embeddings and write the bundle with it under ``ann/``.

    The bundle is read with every check; the result (``out``, default: the bundle itself,
    replaced) is a new directory swapped in atomically: the bundle's files (hard-linked where
    the filesystem allows, else copied), ``ann/`` (any old index replaced), and a manifest whose
    ``files`` lists the index files with their sha256 (so ``read_bundle`` verifies them) and
    whose ``ann`` section records the parameters and the build report. The version changes
    (it is the hash of the files). Returns the build report.
    """
    src = Path(bundle_path)
    bundle = read_bundle(src, verify_checksums=True)
    index = build_index(bundle.embeddings, bundle.layout, params)
    dest = Path(out) if out is not None else src
    if dest.exists() and dest != src:
        raise IvfIndexError(f"{dest} already exists", "out")
    with atomic_dir(dest) as tmp:
        files: dict[str, str] = {}
        for rel, digest in bundle.manifest["files"].items():
            if rel.split("/", 1)[0] == BUNDLE_DIR:
                continue  # the old index goes
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src / rel, target)
            except OSError:
                shutil.copy2(src / rel, target)
            files[rel] = digest
        folder = save_index(index, tmp / BUNDLE_DIR, bundle.embeddings)
        for p in sorted(folder.iterdir()):
            files[f"{BUNDLE_DIR}/{p.name}"] = sha256_file(p)
        manifest = dict(bundle.manifest)
        manifest["files"] = dict(sorted(files.items()))
        manifest["version"] = content_version(manifest["files"])
        manifest["ann"] = {"kind": "ivf", "folder": BUNDLE_DIR, **index.report}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=json_default), "utf-8")
        with (tmp / MANIFEST).open("rb") as fh:
            os.fsync(fh.fileno())
    return {"bundle": str(dest), "version": manifest["version"], **index.report}
