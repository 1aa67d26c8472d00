"""Write a file atomically: readers see the old content or the new, never a partial file.

The one way this project writes single files (reports, plots, CSVs, JSON logs, generated
manifests); a whole folder (a bundle) is swapped in the same way by :func:`atomic_dir`. The
data goes to a temporary sibling (same folder, hence same filesystem), is flushed and fsync'ed, then
``os.replace`` renames it over the target and the folder is fsync'ed so the rename survives
a crash. On any exception the temporary file is removed and the target is untouched. The
parent folder is created. Standard library only.

Permissions: what this module publishes is readable by every uid and writable by its owner only
(files 0o644, folders 0o755; :func:`make_readable`), whatever the writer's umask and whatever
another writer chose (safetensors writes 0o600): a bundle built as root is served by a pod's
non-root user, and the service refuses a bundle that group or others could change.

    atomic_write_text(path, json.dumps(obj))
    with atomic_open(path, "wb") as fh:      # for writers that stream: np.save, savefig, csv
        np.save(fh, array, allow_pickle=False)
    with atomic_dir(folder) as tmp:          # fill tmp; it replaces folder when the block ends
        ...
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, TextIO, overload

__all__ = [
    "FILE_MODE", "FOLDER_MODE", "atomic_dir", "atomic_open", "atomic_write_bytes", "atomic_write_text",
    "fsync_dir", "make_readable",
]

MODES = ("wb", "w")
#: A published file: everyone reads, the owner writes (an owner-executable file keeps 0o755).
FILE_MODE = 0o644
#: A published folder: everyone lists and enters, the owner writes.
FOLDER_MODE = 0o755
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so that a rename or a new entry in it is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_readable(path: str | os.PathLike[str]) -> Path:
    """Give ``path`` and, for a folder, everything under it the published permissions: folders
    0o755, files 0o644 (0o755 when the owner may execute them). Symbolic links are not followed."""
    root = Path(path)
    for p in [root, *root.rglob("*")] if root.is_dir() else [root]:
        mode = p.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        want = FOLDER_MODE if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else FILE_MODE
        if stat.S_IMODE(mode) != want:
            os.chmod(p, want)
    return root


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, exclusively created temp file beside ``path``: ``(fd, temp path)``."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue


@overload
def atomic_open(
    path: str | os.PathLike[str], mode: Literal["wb"] = ..., *, encoding: str = ..., newline: str | None = ...
) -> AbstractContextManager[BinaryIO]: ...
@overload
def atomic_open(
    path: str | os.PathLike[str], mode: Literal["w"], *, encoding: str = ..., newline: str | None = ...
) -> AbstractContextManager[TextIO]: ...
def atomic_open(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str = "utf-8", newline: str | None = None
) -> AbstractContextManager[IO[Any]]:
    """Context manager yielding a handle whose content replaces ``path`` when the block exits
    without an exception. ``mode``: ``"wb"`` (binary) or ``"w"`` (text; ``encoding`` and
    ``newline`` as for ``open``)."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not supported; use one of {list(MODES)}")
    return _atomic_open(Path(path), mode, encoding, newline)


@contextmanager
def _atomic_open(path: Path, mode: str, encoding: str, newline: str | None) -> Iterator[IO[Any]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        try:
            text = mode == "w"
            fh: IO[Any] = os.fdopen(fd, mode, encoding=encoding if text else None, newline=newline)
        except BaseException:
            os.close(fd)
            raise
        with fh:
            yield fh
            fh.flush()
            os.fchmod(fh.fileno(), FILE_MODE)  # not the umask's: see the module docstring
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace ``path``'s content with ``data`` atomically; returns the path."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", newline: str | None = None
) -> Path:
    """Replace ``path``'s content with ``text`` atomically; returns the path."""
    with atomic_open(path, "w", encoding=encoding, newline=newline) as fh:
        fh.write(text)
    return Path(path)


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Context manager yielding a new empty folder beside ``path`` (``.<name>.tmp-*``); when the
    block exits without an exception the folder and everything in it get the published permissions
    (:func:`make_readable`), then it replaces ``path``: an old one is moved aside, the new one
    renamed in, the old one removed, and the parent fsync'ed. On any
    exception the temporary folder is removed and ``path`` is untouched. Fsync'ing the files
    written inside is the caller's job. The parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        make_readable(tmp)
        if path.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, trash / path.name)
            os.replace(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
