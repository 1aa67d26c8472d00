"""Shared fixtures: a tiny random BERT (offline) and a tiny bundle built with it.

``tiny_bert_dir``      session-scoped folder with a random BertConfig(vocab 99, hidden 32, 2 layers)
                       model (safetensors) + word-level tokenizer built from the first TREC passages.
``tiny_bundle``        session-scoped bundle (layout semantic 16 / entity 8 / intent 8, intent classes
                       informational/navigational/transactional, 60 TREC DL passages with docs.jsonl
                       text, two operating points). Treat it as read-only.
``tiny_bundle_factory`` call it to get a fresh, writable copy (for tests that modify or reload bundles).

Markers (registered in pyproject.toml; ``make test`` runs them all, ``make test-fast`` none of
``live``, ``browser``, ``slow``, ``gpu``): a test that uses a live-server fixture gets ``live``,
one that uses the browser gets ``browser``, whatever its file is called (:func:`pytest_itemcollected`).
A test that starts a server another way marks itself: without ``live``, ``bench.live_server.spawn``
refuses to start anything, in the test's process and in those it starts. File names select
nothing (``*_live.py`` is a habit, not a rule).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.live_server import REFUSE_ENV

# the live-server fixtures (server_factory, served, ...) and the headless browser
# (chromium_browser, loopback_page) for every test folder
pytest_plugins = ["tests.live_fixtures", "tests.browser"]

#: fixture -> the marker a test using it (directly or through another fixture) gets
FIXTURE_MARKERS = {
    "server_factory": "live",
    "module_server_factory": "live",
    "_shared_server_factory": "live",  # served, vectors_served
    "chromium_browser": "browser",  # loopback_page
}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark a test from the fixtures it uses (directly or through other fixtures), before ``-m``
    selects: the marker, not the file name, says what a test needs."""
    used = set(getattr(item, "fixturenames", ()))
    for fixture, marker in FIXTURE_MARKERS.items():
        if fixture in used and item.get_closest_marker(marker) is None:
            item.add_marker(marker)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``), the files holding a ``slow`` test first, each file's tests
    kept together and in order: xdist hands whole files out in this order (``--dist loadscope
    --no-loadscope-reorder``), so the long ones start at once instead of leaving one worker alone
    at the end. A run without xdist keeps the collection order."""
    if not hasattr(config, "workerinput"):
        return
    heavy = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in heavy)  # stable: files stay whole and in order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Around a test without the ``live`` marker (its fixtures' set-up included), starting a
    server through ``bench.live_server`` raises, here and in the processes the test starts."""
    if item.get_closest_marker("live") is None:
        os.environ[REFUSE_ENV] = f"{item.nodeid} starts a live server but lacks the 'live' marker"
    try:
        return (yield)
    finally:
        os.environ.pop(REFUSE_ENV, None)


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
    from esp_retrieval.training.data.trec import iter_corpus

    rows = list(iter_corpus(limit=TINY_DOCS))
    return [r[0] for r in rows], [r[1] for r in rows]


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with a tiny random BERT + tokenizer; copy it before modifying it."""
    from esp_retrieval.training.data.trec import iter_corpus
    from esp_retrieval.training.tiny import save_tiny_bert

    texts = [t for _, t in iter_corpus(limit=500)]
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), texts, seed=0)


def build_tiny_model(bert_dir: Path, *, trunk_mode: str = "frozen", architecture: str = "esp", seed: int = 0):
    """An untrained ESPModel on the tiny BERT with the tiny layout (imported lazily: torch)."""
    from esp_retrieval.training.model import ESPModel, Trunk, TrunkMode

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
    from esp_retrieval.training.export import export_bundle

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


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A miniature copy of data/ in the same formats: 4 DL19 + 4 DL20 queries, up to 14 judged
    passages each (the corpus), their qrels, DL-Hard files, 150 ORCAS-I rows, 60 MIMICS rows."""
    import gzip
    import json

    from esp_retrieval.training.data import DEFAULT_DATA_DIR
    from esp_retrieval.training.data.trec import TREC_DIR, iter_corpus, read_qrels, read_queries

    src = DEFAULT_DATA_DIR
    root = tmp_path_factory.mktemp("tiny-data")
    trec_src, trec = src / TREC_DIR, root / TREC_DIR
    (trec / "dl-hard").mkdir(parents=True)
    wanted: dict[str, dict[str, int]] = {}
    for year in ("dl19", "dl20"):
        queries = dict(list(read_queries(trec_src / f"queries.{year}.tsv").items())[:4])
        qrels = read_qrels(trec_src / f"qrels.{year}-passage.txt")
        (trec / f"queries.{year}.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in queries.items()), "utf-8")
        lines = []
        for qid in queries:
            for pid, grade in sorted(qrels.get(qid, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:40]:
                lines.append(f"{qid} Q0 {pid} {grade}\n")
                wanted.setdefault(qid, {})[pid] = grade
        (trec / f"qrels.{year}-passage.txt").write_text("".join(lines), "utf-8")
    pool = {pid for rels in wanted.values() for pid in rels}
    rows, per_query = [], dict.fromkeys(wanted, 0)
    for pid, text in iter_corpus():
        owner = next((q for q, rels in wanted.items() if pid in rels), None)
        if owner is not None and per_query[owner] < 14 and pid in pool:
            per_query[owner] += 1
            rows.append(f"{pid}\t{text}\n")
    with gzip.open(trec / "corpus.tsv.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(rows)
    for name in ("folds.json", "annotations.tsv"):
        shutil.copy(trec_src / "dl-hard" / name, trec / "dl-hard" / name)
    gold = json.loads((trec_src / "dl-hard" / "gold-entity-judgements.json").read_text("utf-8"))
    small = {y: {q: v for q, v in qs.items() if q in wanted} for y, qs in gold.items()}
    (trec / "dl-hard" / "gold-entity-judgements.json").write_text(json.dumps(small), "utf-8")
    for sub, name, n in (
        ("orcas-i-gold", "orcas_i_gold.tsv", 151),
        ("mimics-manual", "MIMICS-Manual.tsv", 61),
    ):
        (root / sub).mkdir()
        with (src / sub / name).open(encoding="utf-8") as fh:
            head = [line for _, line in zip(range(n), fh, strict=False)]
        (root / sub / name).write_text("".join(head), "utf-8")
    return root


def tiny_train_config(data_dir: Path, bert_dir: Path, **overrides):
    """A TrainConfig for second-scale runs on ``tiny_data_dir`` with the tiny BERT."""
    from esp_retrieval.training.config import TrainConfig

    base = {
        "data_dir": str(data_dir),
        "trunk": {"path": str(bert_dir), "mode": "frozen", "max_length": 48, "features_cache": None},
        "adapter_hidden": 16,
        "objectives": [
            {"name": "semantic", "dim": 16, "data": "semantic", "loss": "info_nce", "batch_size": 16},
            {
                "name": "entity",
                "dim": 8,
                "data": "entity",
                "data_params": {"max_df": 1000},
                "loss": "info_nce",
                "batch_size": 8,
            },
            {
                "name": "intent",
                "dim": 8,
                "data": "intent",
                "loss": "cross_entropy",
                "loss_params": {"class_weights": "balanced"},
                "batch_size": 16,
            },
        ],
        "optim": {"steps": 30, "lr": 0.01, "warmup_steps": 0},
        "weighting": {"name": "dwa", "params": {"window": 5}},
        "eval": {"every": 0},
        "export": {"enabled": False},
        # one thread: tiny matrices gain nothing from two, and on a shared CPU two OpenMP threads
        # spin against each other (steps measured ~40x slower under load)
        "threads": 1,
    }
    base.update(overrides)
    return TrainConfig(**base)
