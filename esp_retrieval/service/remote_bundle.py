"""Bundles from object storage: an fsspec URI fetched into a local cache, its digest checked first.

A remote bundle is the URI of the folder holding it (``s3://models/esp/2026-01-07``,
``gs://...``, ``https://host/bundles/2026-01-07``, ``file:///mnt/bundles/new``) and the sha256
of its ``manifest.json`` (what the registry's ``bundle.sha256`` names and ``esp bundle-info``
prints as ``manifest_sha256``; the manifest lists the sha256 of every other file, so that one
digest pins the whole bundle). :func:`fetch_bundle`:

1. reads ``manifest.json`` alone and refuses a digest other than the expected one, before
   anything else is downloaded;
2. downloads each file the manifest lists (no directory listing, so a plain HTTP server
   works), checking each one's sha256 as it arrives;
3. publishes the folder atomically as ``<cache>/<manifest sha256>`` (files 0644, folders 0755);
   a folder already there under that digest is reused.

Any problem is a :class:`BundleFetchError` naming the URI and the file; nothing is published
and the served bundle is kept. The service then loads the local folder through the path every
bundle takes (:func:`esp_retrieval.service.lifecycle.load_and_activate`: every checksum again, warm-up, swap).
Which schemes work depends on what is installed: fsspec brings ``file://`` and ``memory://``,
aiohttp (pinned with it) ``http(s)://``; ``s3://`` needs s3fs and ``gs://`` gcsfs. Credentials
are those the scheme's library reads (environment variables, a mounted key file, workload
identity); fsspec also reads per-scheme options from ``FSSPEC_<SCHEME>_<OPTION>`` variables
(e.g. ``FSSPEC_S3_ENDPOINT_URL`` for a MinIO).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from esp_retrieval.subspace.atomic import atomic_dir
from esp_retrieval.subspace.bundle import MANIFEST, BundleError

__all__ = ["BundleFetchError", "fetch_bundle", "is_uri", "prune_cache", "remote_manifest_sha256"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 22


class BundleFetchError(BundleError):
    """A remote bundle that could not be fetched or does not match its digest."""


def is_uri(ref: object) -> TypeGuard[str]:
    """Whether ``ref`` is a URI (``scheme://...``) rather than a local path."""
    return isinstance(ref, str) and bool(_SCHEME.match(ref))


def _fs(uri: str) -> tuple[Any, str]:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:  # an unknown scheme, or its library is not installed
        raise BundleFetchError(f"{uri}: {exc}") from None
    return fs, str(root).rstrip("/")


def _read_manifest(fs: Any, root: str, uri: str) -> bytes:
    try:
        data = fs.cat_file(f"{root}/{MANIFEST}")
    except Exception as exc:  # each filesystem raises its own errors
        raise BundleFetchError(f"{uri}/{MANIFEST}: cannot be read: {type(exc).__name__}: {exc}") from None
    return bytes(data)


def remote_manifest_sha256(uri: str) -> str:
    """sha256 of the ``manifest.json`` at ``uri`` (one small read)."""
    fs, root = _fs(uri)
    return hashlib.sha256(_read_manifest(fs, root, uri)).hexdigest()


def _listed_files(raw: bytes, uri: str) -> dict[str, str]:
    try:
        files = json.loads(raw)["files"]
    except (ValueError, KeyError, TypeError):
        raise BundleFetchError(f"{uri}/{MANIFEST}: not a bundle manifest (no 'files' object)") from None
    if not isinstance(files, dict):
        raise BundleFetchError(f"{uri}/{MANIFEST}: 'files' must be an object")
    for rel, digest in files.items():
        parts = PurePosixPath(rel).parts
        if not parts or rel.startswith("/") or "\\" in rel or ".." in parts or rel == MANIFEST:
            raise BundleFetchError(f"{uri}/{MANIFEST}: file name {rel!r} is not a path inside the bundle")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise BundleFetchError(f"{uri}/{MANIFEST}: sha256 of {rel!r} is not 64 hex digits")
    return dict(files)


def _download(fs: Any, src: str, dest: Path, expected: str, where: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    try:
        with fs.open(src, "rb") as fin, dest.open("wb") as fout:
            while chunk := fin.read(_CHUNK):
                h.update(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
    except Exception as exc:  # each filesystem raises its own errors
        raise BundleFetchError(f"{where}: cannot be fetched: {type(exc).__name__}: {exc}") from None
    if (got := h.hexdigest()) != expected:
        raise BundleFetchError(f"{where}: sha256 mismatch (the manifest lists {expected}, got {got})")


def fetch_bundle(uri: str, sha256: str | None, cache: str | os.PathLike[str]) -> Path:
    """The bundle at ``uri`` as a local folder ``<cache>/<sha256>`` (see the module docstring).

    ``sha256`` is the expected digest of its ``manifest.json``; a remote bundle without one is
    refused, since nothing would then say which bundle was meant.
    """
    if not sha256:
        raise BundleFetchError(
            f"{uri}: a bundle from object storage needs the sha256 of its {MANIFEST} "
            "(the registry's bundle.sha256, or ESP_BUNDLE_SHA256; esp bundle-info prints it)"
        )
    if not _DIGEST.match(sha256):
        raise BundleFetchError(f"{uri}: expected sha256 {sha256!r} is not 64 lower-case hex digits")
    target = Path(cache) / sha256
    manifest = target / MANIFEST
    if manifest.is_file() and hashlib.sha256(manifest.read_bytes()).hexdigest() == sha256:
        return target  # fetched before; every file's checksum is verified again at load
    fs, root = _fs(uri)
    raw = _read_manifest(fs, root, uri)
    actual = hashlib.sha256(raw).hexdigest()
    if actual != sha256:
        raise BundleFetchError(
            f"{uri}/{MANIFEST}: sha256 is {actual}, expected {sha256}; nothing else was fetched"
        )
    files = _listed_files(raw, uri)
    try:
        with atomic_dir(target) as tmp:
            for rel, digest in sorted(files.items()):
                _download(fs, f"{root}/{rel}", tmp / rel, digest, f"{uri}/{rel}")
            (tmp / MANIFEST).write_bytes(raw)
    except OSError as exc:  # the cache's disk: full, read-only, ...
        raise BundleFetchError(f"{uri}: cannot be written to the cache {cache}: {exc}") from None
    return target


def prune_cache(cache: str | os.PathLike[str], keep: Collection[str | os.PathLike[str]]) -> list[str]:
    """Remove the fetched bundles of ``cache`` except those at ``keep``; returns the digests removed.
    Only folders named by a digest are touched."""
    root = Path(cache)
    kept = {Path(p).resolve() for p in keep}
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for entry in sorted(root.iterdir()):
        fetched = entry.is_dir() and not entry.is_symlink() and _DIGEST.match(entry.name)
        if fetched and entry.resolve() not in kept:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed
