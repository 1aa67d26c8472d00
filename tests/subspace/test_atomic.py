"""esp_retrieval.subspace.atomic: content lands, a failed write leaves the old file (or folder) as it was and no temp."""

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.subspace.atomic import (
    atomic_dir,
    atomic_open,
    atomic_write_bytes,
    atomic_write_text,
    make_readable,
)
from esp_retrieval.subspace.bundle import json_default

OLD = b"old content \x00\xff\n"


class BoomError(Exception):
    pass


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_text_and_bytes_land_and_parents_are_created(tmp_path: Path) -> None:
    text = tmp_path / "a" / "b" / "report.md"
    assert atomic_write_text(text, "héllo\nworld\n") == text
    assert text.read_bytes() == "héllo\nworld\n".encode()
    raw = tmp_path / "blob.bin"
    atomic_write_bytes(raw, OLD)
    atomic_write_bytes(raw, b"new")
    assert raw.read_bytes() == b"new"
    assert _only(tmp_path) == ["a", "blob.bin"]
    assert _only(text.parent) == ["report.md"]


def test_text_newline_and_encoding_are_those_of_open(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    atomic_write_text(path, "a\nb\n", newline="\r\n")
    assert path.read_bytes() == b"a\r\nb\r\n"
    atomic_write_text(path, "é", encoding="latin-1")
    assert path.read_bytes() == b"\xe9"


def test_handle_variants_stream_numpy_and_text(tmp_path: Path) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    with atomic_open(tmp_path / "x.npy", "wb") as fh:
        np.save(fh, arr, allow_pickle=False)
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy", allow_pickle=False), arr)
    with atomic_open(tmp_path / "rows.txt", "w", newline="") as th:
        th.write("one\r\n")
        th.write("two\n")
    assert (tmp_path / "rows.txt").read_bytes() == b"one\r\ntwo\n"


def _fail_bytes(path: Path) -> None:
    atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]


def _fail_text(path: Path) -> None:
    atomic_write_text(path, "x" * 100_000 + "\u20ac", encoding="ascii")


def _fail_handle(path: Path) -> None:
    """Part of the new content is already on disk in the temp file when the writer fails."""
    with atomic_open(path, "w") as fh:
        fh.write("x" * 100_000)
        fh.flush()
        raise BoomError("mid-write")


@pytest.mark.parametrize(
    ("write", "error"),
    [(_fail_bytes, TypeError), (_fail_text, UnicodeEncodeError), (_fail_handle, BoomError)],
)
def test_exception_mid_write_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, write: Callable[[Path], None], error: type[Exception]
) -> None:
    path = tmp_path / "data.json"
    path.write_bytes(OLD)
    with pytest.raises(error):
        write(path)
    assert path.read_bytes() == OLD
    assert _only(tmp_path) == ["data.json"]


def test_no_target_and_failure_creates_nothing(tmp_path: Path) -> None:
    def write() -> None:
        with atomic_open(tmp_path / "new.bin") as fh:
            fh.write(b"partial")
            raise BoomError

    with pytest.raises(BoomError):
        write()
    assert _only(tmp_path) == []


def test_content_is_invisible_until_the_block_exits(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("before")
    with atomic_open(path, "w") as fh:
        fh.write("after")
        fh.flush()
        assert path.read_text() == "before"
        assert len(_only(tmp_path)) == 2  # the target and its temp sibling
    assert path.read_text() == "after"
    assert _only(tmp_path) == ["f.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_files_are_world_readable_and_owner_writable_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "p.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.txt").stat().st_mode) == 0o644


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


def test_make_readable_publishes_a_tree_without_following_links(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "private.safetensors").write_bytes(b"x")
    os.chmod(root / "private.safetensors", 0o600)  # what safetensors' save_file writes
    (root / "sub" / "shared.json").write_text("{}")
    os.chmod(root / "sub" / "shared.json", 0o666)
    (root / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "tool.sh", 0o700)
    os.chmod(root / "sub", 0o700)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.chmod(outside, 0o600)
    (root / "link").symlink_to(outside)
    assert make_readable(root) == root
    modes = _modes(root)
    assert modes.pop("link") != 0  # the link itself is left alone ...
    assert modes == {".": 0o755, "sub": 0o755, "private.safetensors": 0o644, "sub/shared.json": 0o644,
                     "tool.sh": 0o755}
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600  # ... and so is what it points to


def test_atomic_dir_publishes_what_was_written_inside(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "encoder").mkdir()
            (tmp / "encoder" / "heads.safetensors").write_bytes(b"x")
            os.chmod(tmp / "encoder" / "heads.safetensors", 0o600)
    finally:
        os.umask(old)
    assert _modes(tmp_path / "out") == {".": 0o755, "encoder": 0o755, "encoder/heads.safetensors": 0o644}


def test_bad_mode_names_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"mode: 'a'.*\['wb', 'w'\]"):
        atomic_open(tmp_path / "x", "a")  # type: ignore[call-overload]
    assert _only(tmp_path) == []


def test_atomic_dir_swaps_a_whole_folder_in(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "bundle"
    with atomic_dir(out) as tmp:
        assert tmp.parent == out.parent and not out.exists()
        (tmp / "a.txt").write_text("one")
    assert _only(out) == ["a.txt"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    with atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("two")
        assert _only(out) == ["a.txt"]  # the old folder is served until the block exits
    assert _only(out) == ["b.txt"]
    assert _only(out.parent) == ["bundle"]  # no temporary or old folder left


def test_atomic_dir_failure_keeps_the_old_folder_and_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("one")

    def write(folder: Path) -> None:
        with atomic_dir(folder) as tmp:
            (tmp / "b.txt").write_text("two")
            raise BoomError

    with pytest.raises(BoomError):
        write(out)
    assert _only(out) == ["a.txt"] and (out / "a.txt").read_text() == "one"
    assert _only(tmp_path) == ["bundle"]
    with pytest.raises(BoomError):
        write(tmp_path / "new")
    assert _only(tmp_path) == ["bundle"]


def test_json_default_turns_numpy_and_paths_into_json() -> None:
    obj = {"i": np.int64(3), "f": np.float32(0.5), "a": np.arange(3), "p": Path("a/b")}
    assert json.loads(json.dumps(obj, default=json_default)) == {"i": 3, "f": 0.5, "a": [0, 1, 2], "p": "a/b"}
    with pytest.raises(TypeError, match="set"):
        json.dumps({"s": {1}}, default=json_default)
