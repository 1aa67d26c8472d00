"""ORCAS-I gold (Alexander et al. 2022): 1,000 web queries with a manually labelled intent.

Fine labels: Factual, Abstain, Instrumental, Navigational, Transactional. The class set is
configurable: ``"5"`` keeps them, ``"3"`` maps Factual/Abstain/Instrumental to informational
(Broder's taxonomy), or pass an explicit ``{fine_label: class}`` mapping. No public data has
a commercial class, so none is invented.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from esp_retrieval.training.data import DEFAULT_DATA_DIR

FINE = ("Factual", "Abstain", "Instrumental", "Navigational", "Transactional")
PRESETS: dict[str, dict[str, str]] = {
    "5": {c: c.lower() for c in FINE},
    "3": {
        "Factual": "informational",
        "Abstain": "informational",
        "Instrumental": "informational",
        "Navigational": "navigational",
        "Transactional": "transactional",
    },
}


@dataclass(frozen=True)
class IntentData:
    qids: list[str]
    texts: list[str]
    labels: list[int]
    classes: list[str]


def class_mapping(classes: str | Mapping[str, str]) -> dict[str, str]:
    if isinstance(classes, str):
        if classes not in PRESETS:
            raise ValueError(f"intent classes preset {classes!r} is invalid; allowed: {sorted(PRESETS)}")
        return dict(PRESETS[classes])
    missing = sorted(set(FINE) - set(classes))
    if missing:
        raise ValueError(f"intent class mapping lacks ORCAS-I label(s) {missing}; map all of {list(FINE)}")
    return dict(classes)


def load_orcas(data_dir: Path | None = None, classes: str | Mapping[str, str] = "3") -> IntentData:
    mapping = class_mapping(classes)
    names = sorted(set(mapping.values()), key=lambda c: list(mapping.values()).index(c))
    path = (data_dir or DEFAULT_DATA_DIR) / "orcas-i-gold" / "orcas_i_gold.tsv"
    qids, texts, labels = [], [], []
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
            label = row["label_manual"].strip()
            if label not in mapping:
                raise ValueError(
                    f"{path.name}: qid {row['qid']}: unknown label {label!r}; known: {list(FINE)}"
                )
            qids.append(row["qid"])
            texts.append(row["query"])
            labels.append(names.index(mapping[label]))
    return IntentData(qids, texts, labels, names)
