"""Loaders for the shipped data sets and the per-objective training sets built from them.

- :mod:`esp_retrieval.training.data.trec`: TREC DL 2019/2020 queries, passage corpus and graded qrels.
- :mod:`esp_retrieval.training.data.dlhard`: DL-Hard gold entity links and query folds.
- :mod:`esp_retrieval.training.data.orcas`: ORCAS-I intent labels with a configurable class mapping.
- :mod:`esp_retrieval.training.data.mimics`: MIMICS query -> refinement pairs.
- :mod:`training.data.corpus`: streamed corpus files (TSV ``id<TAB>text`` or JSONL) for indexing.
- :mod:`training.data.objectives`: registry of objective data builders (semantic, entity, intent).
"""

from __future__ import annotations

from pathlib import Path

#: the repository's data/ folder (the shipped data sets)
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "data"
