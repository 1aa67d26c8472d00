"""DL-Hard (Mackie et al., SIGIR 2021): gold Wikipedia entity links per query, and query folds.

``gold-entity-judgements.json``: ``{year: {qid: {text, gold_links: [{surface: wiki_url}]}}}``;
``folds.json``: ``{fold: [qid, ...]}`` (5 folds of the DL-Hard queries).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from training.data.trec import trec_dir

_PAREN = re.compile(r"\s*\([^)]*\)\s*$")


@dataclass(frozen=True)
class EntityQuery:
    qid: str
    year: str  # "dl19" | "dl20"
    text: str
    surfaces: tuple[str, ...]  # surface forms as written in the query
    titles: tuple[str, ...]  # Wikipedia titles ("United States Postal Service")

    @property
    def names(self) -> tuple[str, ...]:
        """Every lower-cased string whose presence in a passage counts as a mention."""
        return tuple(sorted({n.lower() for n in (*self.surfaces, *self.titles) if len(n) >= 2}))


def wiki_title(url: str) -> str:
    title = unquote(url.rstrip("/").rsplit("/", 1)[-1]).replace("_", " ")
    return _PAREN.sub("", title).strip()


def load_entity_queries(data_dir: Path | None = None) -> list[EntityQuery]:
    raw = json.loads((trec_dir(data_dir) / "dl-hard" / "gold-entity-judgements.json").read_text("utf-8"))
    out = []
    for year, queries in sorted(raw.items()):
        tag = "dl" + str(year)[-2:]
        for qid, q in sorted(queries.items()):
            surfaces, titles = [], []
            for link in q.get("gold_links") or []:
                for surface, url in link.items():
                    surfaces.append(surface.strip())
                    titles.append(wiki_title(url))
            if surfaces:
                out.append(EntityQuery(qid, tag, q["text"], tuple(surfaces), tuple(titles)))
    return out


def load_folds(data_dir: Path | None = None) -> dict[int, list[str]]:
    raw = json.loads((trec_dir(data_dir) / "dl-hard" / "folds.json").read_text("utf-8"))
    return {int(k): [str(q) for q in v] for k, v in raw.items()}


def name_mentions(names: Iterable[str], passages: Sequence[str]) -> dict[str, set[int]]:
    """For each lower-cased name, the indices of passages containing it as whole words.

    ``str.find`` scans of the joined lower-cased corpus, one per distinct name, with the word
    boundaries checked at each hit (a regex with look-behind would disable the fast literal search).
    """
    joined = "\n".join(p.lower().replace("\n", " ") for p in passages)
    starts, pos = [], 0
    for p in passages:
        starts.append(pos)
        pos += len(p) + 1
    out: dict[str, set[int]] = {}
    for name in names:
        if name in out:
            continue
        found: set[int] = set()
        i = joined.find(name)
        while i >= 0:
            end = i + len(name)
            if (i == 0 or not joined[i - 1].isalnum()) and (end >= len(joined) or not joined[end].isalnum()):
                found.add(bisect.bisect_right(starts, i) - 1)
            i = joined.find(name, i + 1)
        out[name] = found
    return out


def find_mentions(names_per_query: Sequence[tuple[str, ...]], passages: Sequence[str]) -> list[list[int]]:
    """For each query, the sorted indices of passages mentioning any of its names."""
    hits = name_mentions((n for names in names_per_query for n in names), passages)
    return [sorted(set().union(*(hits[n] for n in names))) for names in names_per_query]
