"""Evaluate one trained model (or the zero-shot trunk) on held-out data, from pooled trunk features.

With a frozen trunk every model of the ablation reads the same pooled features, computed once;
a model is then just ``pooled (n, H) -> block-normalised embedding (n, D)`` plus, when it has
one, an intent head ``pooled -> probabilities (n, C)``. :class:`Embedder` is that interface.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.training.evaluate.benchmark import DLBench
from esp_retrieval.training.evaluate.metrics import effective_rank, intent_agreement_at_k
from esp_retrieval.training.evaluate.retrieval import (
    K_EVAL,
    neighbours,
    ranking_conflict,
    score_dl,
    score_dl_sweep,
)


class Embedder(Protocol):
    """What evaluation needs from a model."""

    @property
    def layout(self) -> SubspaceLayout: ...

    def embed(self, pooled: np.ndarray) -> np.ndarray:
        """``(n, H)`` pooled trunk features -> ``(n, D)`` block-normalised float32."""
        ...

    def intent(self, pooled: np.ndarray) -> np.ndarray | None:
        """``(n, H)`` -> ``(n, C)`` class probabilities, or ``None`` without an intent head."""
        ...


@dataclass
class ZeroShot:
    """The untrained trunk: mean-pooled features, L2-normalised, one block. Its "intent head"
    is a nearest-class-centroid cosine classifier fitted on the training fold (no training of
    the encoder) so that macro-F1 has a no-training reference."""

    hidden: int
    centroids: np.ndarray | None = None
    block: str = "shared"

    @property
    def layout(self) -> SubspaceLayout:
        return SubspaceLayout.from_dims({self.block: self.hidden})

    def embed(self, pooled: np.ndarray) -> np.ndarray:
        """The trunk's own embedding: the first ``hidden`` columns (lexical counts, if the run's
        features carry them, are not part of the zero-shot model)."""
        return normalize_blocks(np.asarray(pooled[:, : self.hidden], dtype=np.float32), self.layout)

    def fit_centroids(self, pooled: np.ndarray, labels: Sequence[int], n_classes: int) -> ZeroShot:
        x = self.embed(pooled)
        lab = np.asarray(labels)
        c = np.stack(
            [x[lab == k].mean(axis=0) if np.any(lab == k) else np.zeros(x.shape[1]) for k in range(n_classes)]
        )
        c /= np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
        return ZeroShot(self.hidden, c.astype(np.float32), self.block)

    def intent(self, pooled: np.ndarray) -> np.ndarray | None:
        if self.centroids is None:
            return None
        logits = 16.0 * self.embed(pooled) @ self.centroids.T
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return np.asarray(e / e.sum(axis=1, keepdims=True))


@dataclass
class ModelEmbedder:
    """Adapter for :class:`training.model.ESPModel` (``encode_pooled`` / ``intent_probs_pooled``)."""

    model: Any

    @property
    def layout(self) -> SubspaceLayout:
        layout: SubspaceLayout = self.model.layout
        return layout

    def embed(self, pooled: np.ndarray) -> np.ndarray:
        return normalize_blocks(self.model.encode_pooled(np.asarray(pooled, dtype=np.float32)), self.layout)

    def intent(self, pooled: np.ndarray) -> np.ndarray | None:
        if getattr(self.model, "intent_objective", None) is None:
            return None
        return np.asarray(self.model.intent_probs_pooled(np.asarray(pooled, dtype=np.float32)))


@dataclass(frozen=True)
class Features:
    """Pooled trunk features of every text the benchmark embeds."""

    corpus: np.ndarray  # (N, H), rows = bench.pids
    queries: Mapping[str, np.ndarray]  # qid -> (H,)
    orcas: np.ndarray  # (n_orcas, H)
    mimics: np.ndarray  # (n_mimics, H)


@dataclass
class ModelEval:
    """Held-out results of one model. Per-query values are kept so directions can be pooled."""

    ndcg: dict[str, float]
    entity_p: dict[str, float]
    intent_true: list[int]
    intent_pred: list[int]
    agreement: float
    agreement_intent_only: float
    tau: float
    erank: dict[str, float]
    sweep: list[dict[str, Any]] = field(default_factory=list)  # {"weights", "ndcg": {qid}, "entity_p": {qid}}
    orcas_emb: np.ndarray | None = None
    mimics_emb: np.ndarray | None = None


def _one_hot_weights(layout: SubspaceLayout, name: str) -> dict[str, float]:
    return {n: (1.0 if n == name else 0.0) for n in layout.names}


def evaluate_model(
    embedder: Embedder,
    feats: Features,
    bench: DLBench,
    *,
    eval_year: str,
    orcas_labels: Sequence[int],
    orcas_test: Sequence[int],
    sweep: Sequence[Mapping[str, float]] = (),
    entity_block: str = "entity",
    semantic_block: str = "semantic",
    intent_block: str = "intent",
    keep_embeddings: bool = False,
    erank_rows: int | None = None,
    sparse: Mapping[str, np.ndarray] | None = None,
    sparse_defaults: Mapping[str, float] | None = None,
) -> ModelEval:
    """Score ``embedder`` on the held-out year and ORCAS-I fold (see the module docstring of
    :mod:`esp_retrieval.training.evaluate` for the protocol). ``sweep``: serving weights to trace a front;
    ``sparse``: sparse blocks scored beside the model's (name -> ``(nq, N)`` scores of the year's
    queries, in order), their weights keys of the sweep's; ``sparse_defaults``: their weights at
    the default row (1 when not given; the dense blocks take the layout's defaults)."""
    layout = embedder.layout
    corpus = embedder.embed(feats.corpus)
    qids = list(bench.queries[eval_year])
    q_emb = embedder.embed(np.stack([feats.queries[q] for q in qids]))
    queries = dict(zip(qids, q_emb, strict=True))

    defaults = dict(sparse_defaults) if sparse_defaults else None
    base = score_dl(bench, corpus, queries, layout, weights=defaults, year=eval_year, sparse=sparse)
    curve = [
        {"weights": dict(w), "ndcg": s.per_query_ndcg, "entity_p": s.per_query_entity_p}
        for w, s in zip(sweep, score_dl_sweep(bench, corpus, queries, layout, sweep=[dict(w) for w in sweep],
                                              year=eval_year, sparse=sparse), strict=True)
    ]

    tau = math.nan
    if semantic_block in layout and entity_block in layout:
        tau = ranking_conflict(
            bench,
            corpus,
            queries,
            layout,
            first=semantic_block,
            second=entity_block,
            qids=bench.entity_qids(eval_year),
        )

    rows = (
        corpus
        if erank_rows is None or erank_rows >= len(corpus)
        else corpus[np.random.default_rng(0).choice(len(corpus), erank_rows, replace=False)]
    )
    erank = {"all": effective_rank(rows)}
    if len(layout) > 1:
        for obj in layout.objectives:
            erank[obj.name] = effective_rank(rows[:, obj.offset : obj.end])

    test = list(orcas_test)
    orcas = embedder.embed(feats.orcas)
    probs = embedder.intent(feats.orcas[test])
    labels = np.asarray(orcas_labels)
    pred = [] if probs is None else [int(x) for x in np.argmax(probs, axis=1)]
    nb = neighbours(orcas, layout, None, test, K_EVAL)
    agreement = intent_agreement_at_k(list(labels), nb, test)
    agreement_intent = math.nan
    if intent_block in layout:
        nb_i = neighbours(orcas, layout, _one_hot_weights(layout, intent_block), test, K_EVAL)
        agreement_intent = intent_agreement_at_k(list(labels), nb_i, test)

    return ModelEval(
        ndcg=base.per_query_ndcg,
        entity_p=base.per_query_entity_p,
        intent_true=[int(labels[i]) for i in test],
        intent_pred=pred,
        agreement=agreement,
        agreement_intent_only=agreement_intent,
        tau=tau,
        erank=erank,
        sweep=curve,
        orcas_emb=orcas if keep_embeddings else None,
        mimics_emb=embedder.embed(feats.mimics) if keep_embeddings and len(feats.mimics) else None,
    )
