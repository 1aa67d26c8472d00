"""Shared fixtures: a tiny random BERT (offline) and a tiny bundle built with it.

``tiny_bert_dir``      session-scoped folder with a random BertConfig(vocab 99, hidden 32, 2 layers)
                       model (safetensors) + word-level tokenizer built from the first TREC passages.
``tiny_bundle``        session-scoped bundle (layout semantic 16 / entity 8 / intent 8, intent classes
                       informational/navigational/transactional, 60 TREC DL passages with docs.jsonl
                       text, two operating points). Treat it as read-only.
``tiny_bundle_factory`` call it to get a fresh, writable copy (for tests that modify or reload bundles).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

TINY_DIMS = {"semantic": 16, "entity": 8, "intent": 8}
TINY_INTENT_CLASSES = ["informational", "navigational", "transactional"]
TINY_DOCS = 60
TINY_OPERATING_POINTS = {
    "balanced": {
        "weights": {"semantic": 1.0, "entity": 1.0, "intent": 1.0},
        "description": "all subspaces equal",
        "metrics": {},
    },
    "entity_heavy": {
        "weights": {"semantic": 0.2, "entity": 0.8, "intent": 0.0},
        "description": "favour passages about the query's entity",
        "metrics": {},
    },
}


@pytest.fixture(scope="session")
def tiny_corpus() -> tuple[list[str], list[str]]:
    """(ids, texts) of the first 60 passages of the shipped TREC DL corpus."""
    from training.data.trec import iter_corpus

    rows = list(iter_corpus(limit=TINY_DOCS))
    return [r[0] for r in rows], [r[1] for r in rows]


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with a tiny random BERT + tokenizer; copy it before modifying it."""
    from training.data.trec import iter_corpus
    from training.tiny import save_tiny_bert

    texts = [t for _, t in iter_corpus(limit=500)]
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), texts, seed=0)


def build_tiny_model(bert_dir: Path, *, trunk_mode: str = "frozen", architecture: str = "esp", seed: int = 0):
    """An untrained ESPModel on the tiny BERT with the tiny layout (imported lazily: torch)."""
    from training.model import ESPModel, Trunk, TrunkMode

    trunk = Trunk.from_pretrained(bert_dir, max_length=64, mode=TrunkMode.parse(trunk_mode))
    return ESPModel(
        trunk,
        dict(TINY_DIMS),
        architecture=architecture,
        adapter_hidden=16,
        intent_objective="intent",
        intent_classes=TINY_INTENT_CLASSES,
        seed=seed,
    )


@pytest.fixture
def tiny_model(tiny_bert_dir: Path):
    return build_tiny_model(tiny_bert_dir)


@pytest.fixture(scope="session")
def tiny_bundle(
    tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path, tiny_corpus: tuple[list[str], list[str]]
) -> Path:
    """A valid bundle with an untrained tiny encoder; read-only for tests (use the factory to modify)."""
    from training.export import export_bundle

    ids, texts = tiny_corpus
    model = build_tiny_model(tiny_bert_dir)
    out = tmp_path_factory.mktemp("tiny-bundle-root") / "bundle"
    return export_bundle(
        out,
        model,
        ids,
        texts,
        training={"note": "untrained tiny test model"},
        metrics={},
        operating_points=TINY_OPERATING_POINTS,
        trunk_name="tiny-random-bert",
    )


@pytest.fixture
def tiny_bundle_factory(tiny_bundle: Path, tmp_path: Path) -> Callable[[str], Path]:
    """``factory(name="bundle") -> Path``: a fresh copy of ``tiny_bundle`` under ``tmp_path``."""

    def make(name: str = "bundle") -> Path:
        dest = tmp_path / name
        shutil.copytree(tiny_bundle, dest)
        return dest

    return make
