"""Write a file atomically: readers see the old content or the new, never a partial file.

The one way this project writes single files (reports, plots, CSVs, JSON logs, generated
manifests); a whole folder (a bundle) is swapped in the same way by :func:`atomic_dir`. The
data goes to a temporary sibling (same folder, hence same filesystem), is flushed and fsync'ed, then
``os.replace`` renames it over the target and the folder is fsync'ed so the rename survives
a crash. On any exception the temporary file is removed and the target is untouched. The
parent folder is created. The new file gets ``open()``'s permissions (0o666 minus the umask),
not ``mkstemp``'s 0o600. Standard library only.

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
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, TextIO, overload

__all__ = ["atomic_dir", "atomic_open", "atomic_write_bytes", "atomic_write_text", "fsync_dir"]

MODES = ("wb", "w")
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so that a rename or a new entry in it is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    block exits without an exception the folder (made 0o755) replaces ``path``: an old one is
    moved aside, the new one renamed in, the old one removed, and the parent fsync'ed. On any
    exception the temporary folder is removed and ``path`` is untouched. Fsync'ing the files
    written inside is the caller's job. The parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
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
