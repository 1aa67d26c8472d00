"""The benchmark's data, read from the shipped folders (no network, no pickle).

- TREC DL 2019+2020 passage pool (24,884 passages), queries per year and NIST graded qrels.
  Held-out protocol: **cross-year** — a model trained on DL19 queries is scored on DL20 and
  vice versa, so every score comes from queries the model never trained on.
- DL-HARD gold entities per query: each gold link's surface form and its Wikipedia title
  (URL tail, underscores to spaces, disambiguation dropped). A passage "mentions the
  entity" when it contains any of them as a whole word, case-insensitively.
- MIMICS-Manual refinements as "query + refinement" texts labelled with their parent query.
  (ORCAS-I is read with the trainer's loader, :func:`esp_retrieval.training.data.orcas.load_orcas`.)
"""

from __future__ import annotations

import csv
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from esp_retrieval.training.evaluate.metrics import entity_mentioned, wikipedia_title

YEARS = ("dl19", "dl20")
_GOLD_YEAR = {"dl19": "2019", "dl20": "2020"}


@dataclass
class DLBench:
    """Passages, queries, qrels, gold entities and per-query candidate pools of TREC DL."""

    pids: list[str]
    texts: list[str]
    queries: dict[str, dict[str, str]]  # year -> qid -> text
    qrels: dict[str, dict[str, dict[str, int]]]  # year -> qid -> pid -> grade
    entities: dict[str, tuple[str, ...]]  # qid -> lower-cased surface forms and titles
    pool: dict[str, list[str]]  # qid -> candidate pids (union of the 5 runs' top-100)
    row: dict[str, int] = field(init=False)
    _mentions: dict[tuple[str, int], bool] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.row = {p: i for i, p in enumerate(self.pids)}

    def mentions(self, qid: str, row: int) -> bool:
        """Does passage ``row`` mention one of query ``qid``'s gold entities? (cached)"""
        key = (qid, row)
        if key not in self._mentions:
            self._mentions[key] = entity_mentioned(self.texts[row], self.entities.get(qid, ()))
        return self._mentions[key]

    def entity_qids(self, year: str) -> list[str]:
        """Queries of ``year`` that have at least one gold entity."""
        return [q for q in self.queries[year] if self.entities.get(q)]


def _read_queries(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            qid, text = line.split("\t", 1)
            out[qid] = text.strip()
    return out


def _read_qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            qid, _, pid, grade = line.split()
            out[qid][pid] = int(grade)
    return dict(out)


def read_gold_entities(path: Path) -> dict[str, tuple[str, ...]]:
    """``{qid: (surface, title, ...)}`` from DL-HARD's gold-entity-judgements.json (all years)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, tuple[str, ...]] = {}
    for year in raw.values():
        for qid, item in year.items():
            names: list[str] = []
            for link in item.get("gold_links", []):
                for surface, url in link.items():
                    for n in (surface.strip().lower(), wikipedia_title(url)):
                        if n and n not in names:
                            names.append(n)
            out[str(qid)] = tuple(names)
    return out


def load_dl(
    root: Path,
    queries_per_year: int | None = None,
    pool_per_query: int | None = None,
    corpus: str = "pool",
) -> DLBench:
    """Read the TREC DL folder, all of it by default.

    With ``queries_per_year`` only the first queries of each year that have gold entities are
    kept. ``corpus="pool"`` keeps their pool candidates (the first ``pool_per_query`` of each,
    plus every relevant one); ``corpus="judged"`` keeps only their judged passages in the pool
    (a condensed-list corpus). Without either the corpus is the whole file.
    """
    if corpus not in ("pool", "judged"):
        raise ValueError(f"corpus must be 'pool' or 'judged', got {corpus!r}")
    root = Path(root)
    queries = {y: _read_queries(root / f"queries.{y}.tsv") for y in YEARS}
    qrels = {y: _read_qrels(root / f"qrels.{y}-passage.txt") for y in YEARS}
    entities = read_gold_entities(root / "dl-hard" / "gold-entity-judgements.json")
    pool: dict[str, list[str]] = defaultdict(list)
    with gzip.open(root / "pool.tsv.gz", "rt", encoding="utf-8") as f:
        for rec in csv.DictReader(f, delimiter="\t"):
            cands = pool[rec["qid"]]
            if rec["pid"] not in cands:
                cands.append(rec["pid"])
    keep: set[str] | None = None
    if queries_per_year is not None:
        for y in YEARS:
            chosen = [q for q in queries[y] if entities.get(q)][:queries_per_year]
            queries[y] = {q: queries[y][q] for q in chosen}
    if queries_per_year is not None or pool_per_query is not None or corpus == "judged":
        keep = set()
        for y in YEARS:
            for q in queries[y]:
                judged = qrels[y].get(q, {})
                if corpus == "judged":
                    keep.update(p for p in pool[q] if p in judged)
                    continue
                keep.update(pool[q][:pool_per_query] if pool_per_query else pool[q])
                keep.update(p for p in pool[q] if judged.get(p, 0) > 0)
    pids, texts = [], []
    with gzip.open(root / "corpus.tsv.gz", "rt", encoding="utf-8") as f:
        for line in f:
            pid, text = line.rstrip("\n").split("\t", 1)
            if keep is None or pid in keep:
                pids.append(pid)
                texts.append(text)
    present = set(pids)
    pool_out = {q: [p for p in c if p in present] for q, c in pool.items()}
    return DLBench(pids, texts, queries, qrels, entities, pool_out)


@dataclass(frozen=True)
class LabelledTexts:
    """Texts with one label each (MIMICS refinements labelled with their parent query)."""

    texts: list[str]
    labels: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def load_mimics_clusters(data_dir: Path | None, max_parents: int | None = None) -> LabelledTexts:
    """MIMICS "query + refinement" texts (the trainer's :func:`training.data.mimics.load_mimics_pairs`)
    labelled with their parent query. Only parents with at least two distinct refinements are
    kept (a group of one says nothing about topical agreement); ``max_parents``: the first ones."""
    from esp_retrieval.training.data.mimics import load_mimics_pairs

    by_parent: dict[str, list[str]] = {}
    for q, refined in load_mimics_pairs(data_dir):
        by_parent.setdefault(q, [])
        if refined not in by_parent[q]:
            by_parent[q].append(refined)
    parents = [q for q, r in by_parent.items() if len(r) >= 2][:max_parents]
    seen: set[str] = set()
    texts, labels = [], []
    for q in parents:
        for t in by_parent[q]:
            if t not in seen:  # a refinement shared by two parents is kept once, with the first
                seen.add(t)
                texts.append(t)
                labels.append(q)
    return LabelledTexts(texts, labels)
