"""MIMICS-Manual (Zamani et al. 2020): Bing queries with up to five refinements each.

Each (query, option) becomes a keyword-level semantic pair ``query -> refined query``: the
option itself when it already contains the query, else ``query + " " + option``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from esp_retrieval.training.data import DEFAULT_DATA_DIR


def load_mimics_pairs(data_dir: Path | None = None) -> list[tuple[str, str]]:
    """Unique ``(query, refined query)`` pairs in file order."""
    path = (data_dir or DEFAULT_DATA_DIR) / "mimics-manual" / "MIMICS-Manual.tsv"
    seen: set[tuple[str, str]] = set()
    out = []
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
            q = (row["query"] or "").strip()
            if not q:
                continue
            for i in range(1, 6):
                opt = (row.get(f"option_{i}") or "").strip()
                if not opt:
                    continue
                refined = opt if q.lower() in opt.lower() else f"{q} {opt}"
                if refined.lower() == q.lower() or (q, refined) in seen:
                    continue
                seen.add((q, refined))
                out.append((q, refined))
    return out
