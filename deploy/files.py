"""Write generated files atomically, or report how the committed ones drift from them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

from esp_retrieval.subspace.atomic import atomic_write_text

REPO_ROOT = Path(__file__).resolve().parent.parent


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (for messages)."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def drift(root: Path, files: Mapping[str, str], pattern: str) -> list[str]:
    """Differences between ``files`` (relative path -> text) and what lies under ``root``.

    Files under ``root`` matching ``pattern`` that ``files`` does not name count as stale.
    Returns one line per problem; empty when the tree matches exactly.
    """
    problems = []
    for rel, text in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"{shown(path)}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{shown(path)}: differs from what the generator writes")
    expected = {root / rel for rel in files}
    for path in sorted(root.glob(pattern)):
        if path.is_file() and path not in expected:
            problems.append(f"{shown(path)}: stale, the generator no longer writes it")
    return problems


def sync(root: Path, files: Mapping[str, str], pattern: str, *, check: bool, generator: str) -> int:
    """Write ``files`` under ``root`` (removing stale ones), or with ``check`` only report drift.

    Returns a process exit code: 0 when in sync (or written), 1 when ``check`` found drift.
    """
    problems = drift(root, files, pattern)
    if check:
        for line in problems:
            print(line)
        if problems:
            print(f"run `python -m {generator}` to regenerate")
        return 1 if problems else 0
    for rel, text in files.items():
        path = root / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            atomic_write_text(path, text, newline="\n")
    expected = {root / rel for rel in files}
    for path in root.glob(pattern):
        if path.is_file() and path not in expected:
            path.unlink()
    print(f"{generator}: {len(files)} files under {shown(root)}, {len(problems)} updated")
    return 0


def generator_main(
    generator: str,
    doc: str,
    root: Path,
    build: Callable[[], Mapping[str, str]],
    pattern: str,
    *,
    argv: list[str] | None = None,
) -> int:
    """The command line of a generator module: write its files, or ``--check`` for drift."""
    parser = argparse.ArgumentParser(prog=f"python -m {generator}", description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    args = parser.parse_args(argv)
    return sync(root, build(), pattern, check=args.check, generator=generator)
