"""The artifact bundle: the contract between training and serving (docs/architecture.md section 4).

A bundle is a directory::

    manifest.json    format_version, version, layout, corpus {count, dim, dtype}, files {path: sha256},
                     and free-form sections: encoder, training, operating_points, ...
    embeddings.npy   (N, D) float32 or float16, block-normalised, row i <-> ids[i]
    ids.json         N unique document ids (strings)
    docs.jsonl       optional: one JSON object per row (text, title, url, ...)
    encoder/         optional: the query encoder (written by training, read by the service)
    sparse/<name>/   optional: a sparse block (:class:`subspace.sparse.SparseLexical`: data, indices,
                     indptr .npy and vocab.json), listed in the manifest's ``sparse`` section

It is written atomically (a temporary sibling directory renamed into place) and read back
with every check the service needs before it swaps a bundle in: checksums, shapes, dtype,
layout, ids, and the ``version``, which is derived from the checksums (:func:`content_version`),
so a different bundle cannot reuse a version. Every problem is one :class:`BundleError` naming
the file or field. No pickle.

``read_bundle(..., snapshot=True)`` (what the service serves) reads the embeddings, ids and docs
once into private memory, checks the sha256 of the bytes it read and parses those bytes: editing,
replacing or truncating the files afterwards changes nothing that is served (a shared memory map
would change results under the same version, or fault on truncation). The encoder's files are
hashed here and read again by the query encoder, which checks its bytes against
:attr:`Bundle.encoder_digests` and builds every tensor from them. :func:`writable_by_others`
names the bundle's paths that users other than the owner could change, :func:`unreadable` those
this process cannot read. ``write_bundle`` publishes every file 0o644 and every folder 0o755
(``esp_retrieval.subspace.atomic.make_readable``), so any uid may serve what any uid wrote.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.subspace.atomic import atomic_dir
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.jsonfile import read_json_object
from esp_retrieval.subspace.layout import LayoutError, SubspaceLayout
from esp_retrieval.subspace.sparse import FILES as SPARSE_FILES
from esp_retrieval.subspace.sparse import KIND as SPARSE_KIND
from esp_retrieval.subspace.sparse import SparseLexical
from esp_retrieval.subspace.weights import weight_layout

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings.npy"
IDS = "ids.json"
DOCS = "docs.jsonl"
ENCODER = "encoder"
SPARSE = "sparse"
_SPARSE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
DTYPES = ("float32", "float16")
_CHUNK = 1 << 22


class BundleError(FieldError):
    """A bundle that cannot be written or served; the message names the file or field."""


@dataclass(frozen=True)
class Bundle:
    """A validated bundle. ``embeddings`` is memory-mapped read-only unless loaded eagerly;
    a ``snapshot`` holds the embeddings, ids and docs as read (and hashed) at load."""

    path: Path
    manifest: dict[str, Any]
    layout: SubspaceLayout
    embeddings: np.ndarray
    ids: list[str]
    snapshot: bool = False
    snapshot_docs: list[dict[str, Any]] | None = None
    #: the sparse blocks (``sparse/<name>/``), name -> block, in the manifest's order; read into
    #: memory from the bytes that were hashed
    sparse: Mapping[str, SparseLexical] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """Content hash of the bundle's files: equal bundles have equal versions."""
        return str(self.manifest["version"])

    @property
    def encoder_dir(self) -> Path | None:
        p = self.path / ENCODER
        return p if p.is_dir() else None

    @property
    def encoder_digests(self) -> dict[str, str]:
        """``path in encoder/ -> sha256`` as the manifest lists them: what the query encoder checks
        the bytes it builds from against (``encoder.QueryEncoder.load(..., digests=)``)."""
        prefix = f"{ENCODER}/"
        files: Mapping[str, str] = self.manifest["files"]
        return {rel[len(prefix):]: digest for rel, digest in files.items() if rel.startswith(prefix)}

    @property
    def operating_points(self) -> dict[str, Any]:
        return dict(self.manifest.get("operating_points") or {})

    @property
    def sparse_defaults(self) -> dict[str, float]:
        """Sparse block name -> its default serving weight (the manifest's ``sparse`` section)."""
        return {str(e["name"]): float(e["default_weight"]) for e in self.manifest.get(SPARSE) or ()}

    @functools.cached_property
    def weight_layout(self) -> SubspaceLayout:
        """The names a request's weights may carry: the layout's blocks, then the sparse blocks
        (:func:`esp_retrieval.subspace.weights.weight_layout`); one object per bundle."""
        return weight_layout(self.layout, self.sparse_defaults)

    def docs(self) -> list[dict[str, Any]] | None:
        """Display payload per row, or ``None`` when the bundle has none (a snapshot's as read)."""
        if self.snapshot:
            return self.snapshot_docs
        p = self.path / DOCS
        if not p.exists():
            return None
        with p.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh]


def content_version(files: Mapping[str, str]) -> str:
    """The version of a bundle whose files have these sha256 digests (what ``write_bundle`` writes)."""
    return hashlib.sha256(json.dumps(dict(files), sort_keys=True).encode()).hexdigest()[:12]


def writable_by_others(path: str | os.PathLike[str]) -> list[str]:
    """The bundle directory and the files and folders under it that its group or everyone may
    write (``mode & 0o022``), relative to it (``.`` for the directory itself)."""
    root = Path(path)
    out = []
    for p in [root, *sorted(root.rglob("*"))]:
        try:
            mode = p.lstat().st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode):
            continue
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            out.append("." if p == root else p.relative_to(root).as_posix())
    return out


def unreadable(path: str | os.PathLike[str]) -> list[str]:
    """The bundle directory and the files and folders under it that this process cannot read
    (or, for a folder, enter), relative to it: what a server running as another uid than the
    writer's meets in a bundle an older writer left private (safetensors writes 0o600)."""
    root = Path(path)
    if not os.access(root, os.R_OK | os.X_OK):
        return ["."]
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            continue
        need = os.R_OK | os.X_OK if p.is_dir() else os.R_OK
        if not os.access(p, need):
            out.append(p.relative_to(root).as_posix())
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files_under(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST
    )


def _check_ids(ids: Sequence[Any], n: int, where: str) -> list[str]:
    if len(ids) != n:
        raise BundleError(f"{where}: {len(ids)} ids for {n} embedding rows")
    bad = next((i for i, x in enumerate(ids) if not isinstance(x, str) or not x), None)
    if bad is not None:
        raise BundleError(f"{where}: id at row {bad} must be a non-empty string, got {ids[bad]!r}")
    if len(set(ids)) != n:
        seen: set[str] = set()
        dup = next(x for x in ids if x in seen or seen.add(x))  # type: ignore[func-returns-value]
        raise BundleError(f"{where}: duplicate id {dup!r}")
    return list(ids)


def write_bundle(
    out: str | os.PathLike[str],
    layout: SubspaceLayout,
    embeddings: np.ndarray,
    ids: Sequence[str],
    *,
    docs: Iterable[Mapping[str, Any]] | None = None,
    encoder_dir: str | os.PathLike[str] | None = None,
    sections: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    sparse: Mapping[str, SparseLexical] | None = None,
    sparse_weights: Mapping[str, float] | None = None,
) -> Path:
    """Write a bundle atomically and return its path.

    ``embeddings`` must be ``(N, layout.dim)`` float32/float16 and block-normalised (the caller's
    job; :func:`esp_retrieval.subspace.scoring.normalize_blocks`). ``encoder_dir`` is copied to ``encoder/``.
    Files are written 0o644 and folders 0o755, whatever the umask or the copied files' modes.
    ``sections`` are extra manifest entries (encoder, training, operating_points, ...).
    ``sparse``: name -> :class:`SparseLexical` over the same ``N`` rows, written to
    ``sparse/<name>/`` and listed in the manifest's ``sparse`` section with its default serving
    weight (``sparse_weights``, else 1.0). Nothing is visible at ``out`` until the whole bundle
    is on disk.
    """
    out = Path(out)
    emb = np.asarray(embeddings)
    if emb.ndim != 2 or emb.shape[1] != layout.dim:
        raise BundleError(f"embeddings: shape {emb.shape} does not match layout dim {layout.dim}")
    if emb.dtype.name not in DTYPES:
        raise BundleError(f"embeddings: dtype {emb.dtype} not supported; use one of {DTYPES}")
    if not np.all(np.isfinite(emb)):
        raise BundleError("embeddings: contain NaN or inf")
    id_list = _check_ids(list(ids), emb.shape[0], "ids")
    sparse = dict(sparse or {})
    blocks = _check_sparse(sparse, dict(sparse_weights or {}), layout, emb.shape[0])
    reserved = {"format_version", "version", "layout", "corpus", "files", SPARSE}
    clash = reserved & set(sections or {})
    if clash:
        raise BundleError(f"sections may not override reserved manifest keys {sorted(clash)}")
    if out.exists() and not overwrite:
        raise BundleError(f"{out} already exists (pass overwrite=True to replace it)")

    with atomic_dir(out) as tmp:
        np.save(tmp / EMBEDDINGS, np.ascontiguousarray(emb), allow_pickle=False)
        (tmp / IDS).write_text(json.dumps(id_list), encoding="utf-8")
        if docs is not None:
            n_docs = 0
            with (tmp / DOCS).open("w", encoding="utf-8") as fh:
                for doc in docs:
                    fh.write(json.dumps(dict(doc), ensure_ascii=False) + "\n")
                    n_docs += 1
            if n_docs != emb.shape[0]:
                raise BundleError(f"docs: {n_docs} rows for {emb.shape[0]} embedding rows")
        if encoder_dir is not None:
            shutil.copytree(encoder_dir, tmp / ENCODER)
        for name in blocks:
            sparse[name].save(tmp / SPARSE / name)
        files = {rel: sha256_file(tmp / rel) for rel in _files_under(tmp)}
        version = content_version(files)
        manifest = {
            "format_version": FORMAT_VERSION,
            "version": version,
            "layout": layout.to_dict(),
            "corpus": {"count": int(emb.shape[0]), "dim": layout.dim, "dtype": emb.dtype.name},
            **dict(sections or {}),
            **({SPARSE: list(blocks.values())} if blocks else {}),
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=json_default), "utf-8")
        for rel in [*files, MANIFEST]:
            with (tmp / rel).open("rb") as fh:
                os.fsync(fh.fileno())
    return out


def _check_sparse(
    sparse: dict[str, SparseLexical], weights: dict[str, float], layout: SubspaceLayout, n: int
) -> dict[str, dict[str, Any]]:
    """The manifest entries of the sparse blocks to write (name, kind, vocab size, default weight)."""
    unknown = sorted(set(weights) - set(sparse))
    if unknown:
        raise BundleError(f"sparse_weights: {unknown} are not sparse blocks ({sorted(sparse)})")
    out = {}
    for name, block in sparse.items():
        where = f"sparse.{name}"
        if not isinstance(name, str) or not _SPARSE_NAME.fullmatch(name):
            raise BundleError(f"{where}: a sparse block's name is 1-64 of A-Z a-z 0-9 _ -, got {name!r}")
        if name in layout.names:
            raise BundleError(f"{where}: the layout has a block of that name; weights are keyed by name")
        if not isinstance(block, SparseLexical):
            raise BundleError(f"{where}: must be a SparseLexical, got {type(block).__name__}")
        if block.n_docs != n:
            raise BundleError(f"{where}: {block.n_docs} documents for {n} embedding rows")
        weight = weights.get(name, 1.0)
        if not _is_weight(weight):
            raise BundleError(f"sparse_weights.{name}: must be a finite number >= 0, got {weight!r}")
        out[name] = {"name": name, "kind": SPARSE_KIND, "vocab_size": len(block.vocab),
                     "default_weight": float(weight)}
    return out


def _is_weight(w: Any) -> bool:
    return not isinstance(w, bool) and isinstance(w, int | float) and bool(np.isfinite(w)) and w >= 0


def json_default(obj: Any) -> Any:
    """``json.dumps(..., default=json_default)``: numpy scalars and arrays as Python numbers and
    lists, paths as strings; anything else is a ``TypeError`` naming its type."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and shape-check ``manifest.json`` only (cheap; no checksums)."""
    manifest = read_json_object(
        Path(path) / MANIFEST,
        BundleError,
        required=("format_version", "version", "layout", "corpus", "files"),
        folder="bundle directory",
    )
    if manifest["format_version"] != FORMAT_VERSION:
        raise BundleError(
            f"{MANIFEST}: format_version {manifest['format_version']!r} is not supported "
            f"(this build reads {FORMAT_VERSION})"
        )
    if not isinstance(manifest["files"], dict) or not isinstance(manifest["corpus"], dict):
        raise BundleError(f"{MANIFEST}: 'files' and 'corpus' must be objects")
    return manifest


def _npy_from_bytes(data: bytes) -> np.ndarray:
    """A ``.npy`` file's array, read-only over ``data`` (no copy, no pickle)."""
    fh = io.BytesIO(data)
    major, _minor = np.lib.format.read_magic(fh)
    if major == 1:
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif major in (2, 3):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise ValueError(f"unsupported .npy format version {major}")
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed (they would need pickle)")
    count = int(np.prod(shape, dtype=np.int64))
    offset = fh.tell()
    if len(data) - offset < count * dtype.itemsize:
        raise ValueError(f"{len(data) - offset} data bytes for shape {shape} of {dtype}")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C")


def _read_listed(root: Path, rel: str, listed: Mapping[str, str], verify: bool) -> bytes:
    """A listed file's bytes, read once; with ``verify``, checked against its listed sha256."""
    data = (root / rel).read_bytes()
    if verify and hashlib.sha256(data).hexdigest() != listed[rel]:
        raise BundleError(f"{rel}: sha256 mismatch (corrupt, truncated or modified file)")
    return data


def read_bundle(
    path: str | os.PathLike[str],
    *,
    mmap: bool = True,
    verify_checksums: bool = True,
    snapshot: bool = False,
) -> Bundle:
    """Open and validate a bundle; raise :class:`BundleError` naming what is wrong.

    Checks, in order: manifest, layout, every listed file present (and no unlisted ones),
    sha256 of each file, embeddings shape/dtype against the manifest and layout, ids, and the
    manifest's ``version`` against :func:`content_version` of its checksums.
    ``mmap=True`` maps the embeddings read-only (costs disk, not RAM, until touched).
    ``snapshot=True`` (``mmap`` ignored): embeddings, ids and docs are read once into private
    memory, hashed as read and parsed from those bytes, so the files may change afterwards
    without changing what this :class:`Bundle` holds (the encoder's files are only hashed here:
    the query encoder reads them once more, checked against :attr:`Bundle.encoder_digests`).
    """
    root = Path(path)
    manifest = read_manifest(root)
    try:
        layout = SubspaceLayout.from_dict(manifest["layout"])
    except (LayoutError, TypeError) as exc:
        raise BundleError(f"{MANIFEST}: layout is invalid: {exc}") from exc

    listed: dict[str, str] = manifest["files"]
    for rel in (EMBEDDINGS, IDS):
        if rel not in listed:
            raise BundleError(f"{MANIFEST}: 'files' does not list {rel}")
    present = set(_files_under(root))
    for rel in listed:
        if rel not in present:
            raise BundleError(f"{rel}: listed in the manifest but missing from {root}")
    extra = sorted(present - set(listed))
    if extra:
        raise BundleError(f"{extra[0]}: present in {root} but not listed in the manifest")
    # sparse blocks live in memory: always read once, hashed as read and parsed from those bytes
    private = {rel for rel in listed if rel.startswith(f"{SPARSE}/")}
    private |= {EMBEDDINGS, IDS, DOCS} if snapshot else set()
    raw: dict[str, bytes] = {}
    for rel, digest in listed.items():
        if rel in private:
            raw[rel] = _read_listed(root, rel, listed, verify_checksums)
        elif verify_checksums and sha256_file(root / rel) != digest:
            raise BundleError(f"{rel}: sha256 mismatch (corrupt, truncated or modified file)")

    corpus = manifest["corpus"]
    try:
        if snapshot:
            emb = _npy_from_bytes(raw.pop(EMBEDDINGS))
        else:
            emb = np.load(root / EMBEDDINGS, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BundleError(f"{EMBEDDINGS}: unreadable ({exc})") from exc
    if emb.ndim != 2 or emb.shape[1] != layout.dim:
        raise BundleError(f"{EMBEDDINGS}: shape {emb.shape} does not match layout dim {layout.dim}")
    if emb.shape[0] != corpus.get("count"):
        raise BundleError(
            f"{EMBEDDINGS}: {emb.shape[0]} rows but manifest corpus.count is {corpus.get('count')}"
        )
    if emb.dtype.name != corpus.get("dtype") or emb.dtype.name not in DTYPES:
        raise BundleError(
            f"{EMBEDDINGS}: dtype {emb.dtype} but manifest corpus.dtype is {corpus.get('dtype')!r}"
            f" (supported: {DTYPES})"
        )
    try:
        ids = json.loads(raw.pop(IDS) if snapshot else (root / IDS).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{IDS}: not valid JSON ({exc})") from exc
    if not isinstance(ids, list):
        raise BundleError(f"{IDS}: must be a JSON list of strings")
    ids = _check_ids(ids, emb.shape[0], IDS)
    docs: list[dict[str, Any]] | None = None
    if snapshot and DOCS in raw:
        docs = _parse_docs(raw.pop(DOCS), len(ids))
    sparse = _read_sparse(manifest, layout, emb.shape[0], raw)
    expected = content_version(listed)
    if str(manifest["version"]) != expected:
        raise BundleError(
            f"{MANIFEST}: version {manifest['version']!r} is not the version of its files' checksums "
            f"({expected!r}); a bundle's version is derived from its content (write it with write_bundle)"
        )
    return Bundle(
        path=root, manifest=manifest, layout=layout, embeddings=emb, ids=ids, snapshot=snapshot,
        snapshot_docs=docs, sparse=sparse,
    )


def _read_sparse(
    manifest: Mapping[str, Any], layout: SubspaceLayout, n: int, raw: dict[str, bytes]
) -> dict[str, SparseLexical]:
    """The manifest's sparse blocks, each parsed from the bytes hashed as read (``raw``) (checked: listed
    files, kind, vocabulary size, one row per corpus row); no file under ``sparse/`` is left out."""
    section = manifest.get(SPARSE, [])
    if not isinstance(section, list) or not all(isinstance(e, dict) for e in section):
        raise BundleError(f"{MANIFEST}: '{SPARSE}' must be a list of objects")
    listed: dict[str, str] = manifest["files"]
    out: dict[str, SparseLexical] = {}
    for i, entry in enumerate(section):
        where = f"{MANIFEST}:{SPARSE}[{i}]"
        name = entry.get("name")
        if not isinstance(name, str) or not _SPARSE_NAME.fullmatch(name) or name in out:
            raise BundleError(f"{where}.name: a new name of 1-64 of A-Z a-z 0-9 _ -, got {name!r}")
        if name in layout.names:
            raise BundleError(f"{where}.name: {name!r} is also a layout block")
        if entry.get("kind") != SPARSE_KIND:
            kind = entry.get("kind")
            raise BundleError(f"{where}.kind: {kind!r} is not supported (this build reads {SPARSE_KIND!r})")
        weight = entry.get("default_weight")
        if not _is_weight(weight):
            raise BundleError(f"{where}.default_weight: must be a finite number >= 0, got {weight!r}")
        files = {f: f"{SPARSE}/{name}/{f}" for f in SPARSE_FILES}
        for rel in files.values():
            if rel not in listed:
                raise BundleError(f"{MANIFEST}: 'files' does not list {rel}")
        try:
            block = SparseLexical.from_bytes({f: raw.pop(rel) for f, rel in files.items()})
        except ValueError as exc:
            if isinstance(exc, BundleError):
                raise
            raise BundleError(f"{SPARSE}/{name}/{exc}") from exc
        if len(block.vocab) != entry.get("vocab_size"):
            raise BundleError(
                f"{SPARSE}/{name}/vocab.json: {len(block.vocab)} terms but {where}.vocab_size is "
                f"{entry.get('vocab_size')!r}"
            )
        if block.n_docs != n:
            raise BundleError(f"{SPARSE}/{name}/vocab.json: {block.n_docs} documents but corpus.count is {n}")
        out[name] = block
    stray = sorted(r for r in listed if r.startswith(f"{SPARSE}/") and r.split("/")[1] not in out)
    if stray:
        raise BundleError(f"{stray[0]}: under {SPARSE}/ but not a sparse block of the manifest")
    return out


def _parse_docs(data: bytes, n: int) -> list[dict[str, Any]]:
    docs = []
    try:
        for i, line in enumerate(data.decode("utf-8").splitlines()):
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise BundleError(f"{DOCS}: line {i + 1} is not a JSON object")
            docs.append(doc)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{DOCS}: not valid JSON lines ({exc})") from exc
    if len(docs) != n:
        raise BundleError(f"{DOCS}: {len(docs)} rows for {n} embedding rows")
    return docs
