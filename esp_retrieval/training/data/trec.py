"""TREC Deep Learning 2019/2020 passage task: queries, the pooled passage corpus, graded qrels.

Files (``data/trec-dl-2019-2020-passage/``): ``corpus.tsv.gz`` (pid<TAB>passage, 24,884 rows),
``queries.dl19.tsv`` / ``queries.dl20.tsv`` (qid<TAB>query), ``qrels.dl{19,20}-passage.txt``
(``qid Q0 pid grade``, grades 0-3).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from esp_retrieval.training.data import DEFAULT_DATA_DIR

TREC_DIR = "trec-dl-2019-2020-passage"
YEARS = ("dl19", "dl20")


@dataclass(frozen=True)
class TrecDL:
    """Corpus (ids + texts in file order), queries per year and graded qrels per query."""

    pids: list[str]
    passages: list[str]
    queries: dict[str, dict[str, str]]  # year -> {qid: text}
    qrels: dict[str, dict[str, int]]  # qid -> {pid: grade}

    def query_year(self, qid: str) -> str:
        return next(y for y, qs in self.queries.items() if qid in qs)


def trec_dir(data_dir: Path | None = None) -> Path:
    return (data_dir or DEFAULT_DATA_DIR) / TREC_DIR


def iter_corpus(data_dir: Path | None = None, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """``(pid, passage)`` in file order (sorted by integer pid)."""
    with gzip.open(trec_dir(data_dir) / "corpus.tsv.gz", "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if limit is not None and n >= limit:
                return
            pid, text = line.rstrip("\n").split("\t", 1)
            yield pid, text


def read_queries(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                qid, text = line.rstrip("\n").split("\t", 1)
                out[qid] = text
    return out


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 4:
                out.setdefault(parts[0], {})[parts[2]] = int(parts[3])
    return out


def load_trec(data_dir: Path | None = None) -> TrecDL:
    root = trec_dir(data_dir)
    pids, passages = [], []
    for pid, text in iter_corpus(data_dir):
        pids.append(pid)
        passages.append(text)
    queries = {y: read_queries(root / f"queries.{y}.tsv") for y in YEARS}
    qrels: dict[str, dict[str, int]] = {}
    for y in YEARS:
        qrels.update(read_qrels(root / f"qrels.{y}-passage.txt"))
    return TrecDL(pids=pids, passages=passages, queries=queries, qrels=qrels)
