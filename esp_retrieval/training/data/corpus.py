"""Streamed corpus files for indexing: TSV ``id<TAB>text`` or JSONL ``{"id", "text", ...}``.

- Format by extension: ``.tsv``/``.txt`` (optionally ``.gz``) or ``.jsonl``/``.ndjson`` (optionally ``.gz``).
- TSV: exactly ``id<TAB>text`` per line (the text may itself contain no tab); a first line
  ``id<TAB>text`` is a header and skipped. JSONL: ``id`` (string or integer) and ``text``
  required; every other field (title, url, ...) is display payload kept in ``docs.jsonl``.
- Blank lines are skipped. Every problem — invalid UTF-8, a missing column or field, an empty
  or duplicate id, invalid JSON — stops with :class:`CorpusError` naming the file and line.
- Empty texts are not errors: the caller decides (``esp index`` skips them and reports how many).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from esp_retrieval.subspace.errors import FieldError

TSV_SUFFIXES = (".tsv", ".txt")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


class CorpusError(FieldError):
    """A corpus file that cannot be indexed; the message names the file and line."""


@dataclass
class Doc:
    id: str
    text: str
    line: int
    display: dict[str, Any] = field(default_factory=dict)


def corpus_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in TSV_SUFFIXES:
        return "tsv"
    if last in JSONL_SUFFIXES:
        return "jsonl"
    raise CorpusError(
        f"{path}: unknown corpus format {last!r}; use .tsv (id<TAB>text) or .jsonl (optionally .gz)"
    )


def _open(path: Path) -> IO[bytes]:
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return path.open("rb")


def read_corpus(path: str | Path, *, check_unique: bool = True) -> Iterator[Doc]:
    """Yield documents in file order, checking ids and encoding line by line."""
    p = Path(path)
    fmt = corpus_format(p)
    with _open(p) as fh:
        yield from parse_lines(fh, p, fmt, check_unique=check_unique)


def parse_lines(
    lines: Iterable[bytes], p: str | Path, fmt: str, *, check_unique: bool = True
) -> Iterator[Doc]:
    """:func:`read_corpus` on raw lines of the file ``p`` (named in errors) in format ``fmt``."""
    seen: dict[str, int] = {}
    for n, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{p}:{n}: invalid UTF-8 at byte {exc.start}") from exc
        if n == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        if fmt == "tsv":
            parts = line.split("\t")
            if n == 1 and [x.strip().lower() for x in parts] == ["id", "text"]:
                continue
            if len(parts) != 2:
                raise CorpusError(f"{p}:{n}: expected 2 tab-separated columns (id, text), got {len(parts)}")
            doc = Doc(parts[0].strip(), parts[1], n)
            if not doc.id:
                raise CorpusError(f"{p}:{n}: empty id")
        else:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{p}:{n}: invalid JSON ({exc.msg})") from exc
            doc = record_doc(obj, p, n)
        if check_unique:
            if doc.id in seen:
                raise CorpusError(f"{p}:{n}: duplicate id {doc.id!r} (first on line {seen[doc.id]})")
            seen[doc.id] = n
        yield doc


def record_doc(obj: Any, p: str | Path, n: int) -> Doc:
    """One JSONL object (or table row) ``{"id", "text", display...}`` at line/row ``n`` of ``p``."""
    if not isinstance(obj, dict):
        raise CorpusError(f"{p}:{n}: expected a JSON object with 'id' and 'text'")
    for key in ("id", "text"):
        if key not in obj:
            raise CorpusError(f"{p}:{n}: missing field {key!r}")
    if isinstance(obj["id"], bool) or not isinstance(obj["id"], str | int):
        raise CorpusError(f"{p}:{n}: field 'id' must be a string or integer")
    if not isinstance(obj["text"], str):
        raise CorpusError(f"{p}:{n}: field 'text' must be a string")
    display = {k: v for k, v in obj.items() if k != "id"}
    doc = Doc(str(obj["id"]).strip(), obj["text"], n, display)
    if not doc.id:
        raise CorpusError(f"{p}:{n}: empty id")
    return doc
