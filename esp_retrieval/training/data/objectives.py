"""Objective data sets built from the shipped data, with held-out splits that are never trained on.

Registry :data:`BUILDERS` (config ``objectives[].data``):

- ``semantic``: TREC DL pairs query -> passage graded ``>= min_grade`` for the training queries,
  optional judged-non-relevant hard negatives, plus MIMICS ``query -> refined query`` pairs.
  Held out: NDCG@10 over the passage corpus for the held-out queries.
- ``entity``: DL-Hard queries with gold entity links -> passages that mention a linked entity
  (surface form or Wikipedia title, whole words; names found in more than ``max_df`` passages
  are too generic and ignored). Held out: fraction of the top-10 passages that mention one of
  the query's entities (``entity_p@10``), and ``entity_hit@10`` (any of them does).
- ``intent``: ORCAS-I queries with their (mapped) intent class. Held out: a fixed fraction of
  queries chosen by a hash of the qid, or (``intent_folds: k``) fold ``intent_fold`` of a
  stratified k-fold split (:func:`stratified_folds`); accuracy and macro-F1.

Query split (:class:`Split`): ``by: year`` trains on one TREC DL year and holds out the other
(queries of both the semantic and the entity objective), ``by: fold`` holds out the DL-Hard
folds listed and trains on every other query.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esp_retrieval.training.data.batching import random_batches, unique_batches
from esp_retrieval.training.data.dlhard import load_entity_queries, load_folds, name_mentions
from esp_retrieval.training.data.mimics import load_mimics_pairs
from esp_retrieval.training.data.orcas import load_orcas
from esp_retrieval.training.data.trec import TrecDL, load_trec
from esp_retrieval.training.losses.base import TaskOutput
from esp_retrieval.training.registry import build

#: ``texts -> (n, d)`` objective vectors (L2-normalised) of one objective
Embed = Callable[[list[str]], torch.Tensor]
#: ``(n, d) vectors -> (n, C)`` class logits (the cosine intent classifier)
Classify = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Split:
    by: str = "year"  # "year" | "fold"
    heldout_year: str = "dl20"
    heldout_folds: tuple[int, ...] = (5,)
    intent_heldout_fraction: float = 0.2
    intent_folds: int | None = None  # k of a stratified k-fold split of ORCAS-I; None: hash fraction
    intent_fold: int = 0  # the fold held out when intent_folds is set


class TrainSet:
    """Training rows of one objective data kind: the trainer talks to this interface only.

    Each kind knows the texts it embeds, how its mini-batches are drawn and which
    :class:`~esp_retrieval.training.losses.base.TaskOutput` fields a batch fills, so adding a kind is one
    subclass (no branches on the kind elsewhere).
    """

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def texts_used(self) -> set[str]:
        """Every text a batch may embed (frozen mode computes their trunk features up front)."""
        raise NotImplementedError  # pragma: no cover

    def batches(self, batch_size: int, seed: int) -> Iterator[list[int]]:
        """Row-index batches, forever (seeded)."""
        raise NotImplementedError  # pragma: no cover

    def task_output(
        self, idx: list[int], embed: Embed, rng: random.Random, classify: Classify | None
    ) -> TaskOutput:
        """The loss inputs of rows ``idx``; ``rng`` draws hard negatives, ``classify`` gives logits."""
        raise NotImplementedError  # pragma: no cover

    def digest_rows(self) -> list[str]:
        """One line per training row, hashed into the bundle's ``data_hashes``."""
        raise NotImplementedError  # pragma: no cover

    def init_rows(self) -> tuple[list[str], list[int] | None]:
        """The texts a data-driven head initialisation reads, with class labels for a
        classification set (``None`` otherwise)."""
        return sorted(self.texts_used()), None

    def class_names(self) -> list[str] | None:
        """The classes of a classification set; ``None`` for other kinds."""
        return None

    def balanced_class_weights(self) -> list[float] | None:
        """``n / (C * count_c)`` per class (scikit-learn's 'balanced'); ``None``: not classification."""
        return None


@dataclass
class PairSet(TrainSet):
    """Training pairs; ``groups[i]`` identifies the anchor (no two rows of a group in one batch)."""

    anchors: list[str]
    positives: list[str]
    groups: list[str]
    negatives: dict[str, list[str]] = field(default_factory=dict)  # group -> hard negative texts
    targets: list[float] | None = None

    def __len__(self) -> int:
        return len(self.anchors)

    def texts_used(self) -> set[str]:
        return set(self.anchors) | set(self.positives) | {n for v in self.negatives.values() for n in v}

    def batches(self, batch_size: int, seed: int) -> Iterator[list[int]]:
        return unique_batches(self.groups, self.positives, batch_size, seed)

    def task_output(
        self, idx: list[int], embed: Embed, rng: random.Random, classify: Classify | None
    ) -> TaskOutput:
        """Anchors, positives and at most one hard negative per row (shared by the batch)."""
        anchors = [self.anchors[i] for i in idx]
        positives = [self.positives[i] for i in idx]
        negs = []
        for i in idx:
            cands = self.negatives.get(self.groups[i])
            if cands:
                negs.append(rng.choice(cands))
        z = embed(anchors + positives + negs)
        n = len(idx)
        t = self.targets
        targets = None if t is None else torch.tensor([t[i] for i in idx], device=z.device)
        return TaskOutput(
            anchors=z[:n], positives=z[n : 2 * n], negatives=z[2 * n :] if negs else None, targets=targets
        )

    def digest_rows(self) -> list[str]:
        return [f"{a}\t{p}" for a, p in zip(self.anchors, self.positives, strict=True)]


@dataclass
class ClassSet(TrainSet):
    texts: list[str]
    labels: list[int]
    classes: list[str]

    def __len__(self) -> int:
        return len(self.texts)

    def texts_used(self) -> set[str]:
        return set(self.texts)

    def batches(self, batch_size: int, seed: int) -> Iterator[list[int]]:
        return random_batches(len(self), batch_size, seed)

    def task_output(
        self, idx: list[int], embed: Embed, rng: random.Random, classify: Classify | None
    ) -> TaskOutput:
        """The texts' vectors, their labels and (with a classifier) the class logits."""
        z = embed([self.texts[i] for i in idx])
        labels = torch.tensor([self.labels[i] for i in idx], device=z.device)
        return TaskOutput(anchors=z, logits=classify(z) if classify is not None else None, labels=labels)

    def digest_rows(self) -> list[str]:
        return [f"{x}\t{y}" for x, y in zip(self.texts, self.labels, strict=True)]

    def init_rows(self) -> tuple[list[str], list[int] | None]:
        return list(self.texts), list(self.labels)

    def class_names(self) -> list[str] | None:
        return self.classes

    def balanced_class_weights(self) -> list[float] | None:
        counts = np.bincount(np.asarray(self.labels), minlength=len(self.classes)).astype(np.float64)
        return (len(self.labels) / (len(self.classes) * np.maximum(counts, 1))).tolist()


@dataclass
class HeldOut:
    """``kind``: ``retrieval`` (qrels graded), ``entity`` (relevant = mentioning rows), ``classification``."""

    kind: str
    queries: dict[str, str] = field(default_factory=dict)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)


@dataclass
class ObjectiveData:
    name: str
    train: TrainSet
    heldout: HeldOut
    stats: dict[str, Any]


class DataContext:
    """Shared, lazily loaded sources for the builders (loads each file once)."""

    def __init__(self, data_dir: Path | None, split: Split, seed: int = 0) -> None:
        self.data_dir = data_dir
        self.split = split
        self.seed = seed
        if split.by not in ("year", "fold"):
            raise ValueError(f"split.by {split.by!r} is invalid; allowed: 'year', 'fold'")

    @cached_property
    def trec(self) -> TrecDL:
        return load_trec(self.data_dir)

    @cached_property
    def heldout_qids(self) -> set[str]:
        """Query ids never trained on (semantic and entity objectives)."""
        if self.split.by == "year":
            if self.split.heldout_year not in self.trec.queries:
                raise ValueError(
                    f"split.heldout_year {self.split.heldout_year!r} is invalid; "
                    f"allowed: {sorted(self.trec.queries)}"
                )
            ids = set(self.trec.queries[self.split.heldout_year])
            ids |= {q.qid for q in load_entity_queries(self.data_dir) if q.year == self.split.heldout_year}
            return ids
        folds = load_folds(self.data_dir)
        bad = sorted(set(self.split.heldout_folds) - set(folds))
        if bad:
            raise ValueError(f"split.heldout_folds {bad} do not exist; allowed: {sorted(folds)}")
        return {q for f in self.split.heldout_folds for q in folds[f]}

    def is_heldout(self, qid: str) -> bool:
        return qid in self.heldout_qids

    def all_queries(self) -> dict[str, str]:
        return {q: t for qs in self.trec.queries.values() for q, t in qs.items()}


def _hash_fraction(key: str) -> float:
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def stratified_folds(keys: list[str], labels: list[int], k: int) -> list[int]:
    """Fold ``0..k-1`` of every row: stratified (each class dealt round-robin over the folds, so
    every fold holds ``n_c / k`` of class ``c``, +-1) in an order fixed by a hash of the key.

    Deterministic and independent of row order and seed: every run, method and process sees the
    same folds, which is what comparing methods on pooled cross-validated predictions needs.
    """
    if k < 2:
        raise ValueError(f"split.intent_folds must be >= 2, got {k!r}")
    folds = [0] * len(keys)
    for c in sorted(set(labels)):
        rows = [i for i, lab in enumerate(labels) if lab == c]
        rows.sort(key=lambda i: _hash_fraction(f"fold:{keys[i]}"))
        for rank, i in enumerate(rows):
            folds[i] = rank % k
    return folds


def build_semantic(
    ctx: DataContext,
    *,
    min_grade: int = 2,
    hard_negatives: bool = True,
    mimics: bool = True,
    max_mimics_pairs: int | None = None,
) -> ObjectiveData:
    trec = ctx.trec
    text_of = dict(zip(trec.pids, trec.passages, strict=True))
    queries = ctx.all_queries()
    anchors, positives, groups, negatives = [], [], [], {}
    held_q, held_rels = {}, {}
    for qid, text in queries.items():
        rels = {p: g for p, g in trec.qrels.get(qid, {}).items() if p in text_of}
        if ctx.is_heldout(qid):
            if any(g >= min_grade for g in rels.values()):
                held_q[qid], held_rels[qid] = text, rels
            continue
        for pid, grade in sorted(rels.items()):
            if grade >= min_grade:
                anchors.append(text)
                positives.append(text_of[pid])
                groups.append(f"trec:{qid}")
        if hard_negatives:
            negs = [text_of[p] for p, g in sorted(rels.items()) if g == 0]
            if negs:
                negatives[f"trec:{qid}"] = negs
    n_trec = len(anchors)
    if mimics:
        pairs = load_mimics_pairs(ctx.data_dir)
        if max_mimics_pairs is not None:
            pairs = random.Random(ctx.seed).sample(pairs, min(max_mimics_pairs, len(pairs)))
        for q, refined in pairs:
            anchors.append(q)
            positives.append(refined)
            groups.append(f"mimics:{q}")
    return ObjectiveData(
        "semantic",
        PairSet(anchors, positives, groups, negatives),
        HeldOut("retrieval", queries=held_q, qrels=held_rels),
        {"trec_pairs": n_trec, "mimics_pairs": len(anchors) - n_trec, "heldout_queries": len(held_q)},
    )


def _word_index(texts: list[str]) -> dict[str, set[int]]:
    """Lower-cased alphanumeric word -> rows of ``texts`` containing it."""
    index: dict[str, set[int]] = {}
    for i, t in enumerate(texts):
        for w in set(_WORD.findall(t.lower())):
            index.setdefault(w, set()).add(i)
    return index


_WORD = re.compile(r"[a-z0-9]+")


def build_entity(
    ctx: DataContext,
    *,
    max_df: int = 500,
    max_pairs_per_query: int = 64,
    hard_negatives: bool = False,
    negatives_per_query: int = 32,
) -> ObjectiveData:
    """Query -> passage-mentioning-its-gold-entity pairs (DL-HARD links, training queries only).

    ``hard_negatives``: per query, passages that share a word of an entity name (the surname of
    "robert gray", a word of a title) but mention none of its names: same surname, different
    entity, the confusion a bag of words makes.
    """
    trec = ctx.trec
    eqs = load_entity_queries(ctx.data_dir)
    hits = name_mentions(sorted({n for q in eqs for n in q.names}), trec.passages)
    rng = random.Random(ctx.seed)
    words = _word_index(trec.passages) if hard_negatives else {}
    negatives: dict[str, list[str]] = {}
    anchors, positives, groups = [], [], []
    held_q: dict[str, str] = {}
    held_rels: dict[str, dict[str, int]] = {}
    mentions = [sorted(set().union(*(hits[n] for n in q.names if len(hits[n]) <= max_df))) for q in eqs]
    for q, rows in zip(eqs, mentions, strict=True):
        if not rows:
            continue
        if ctx.is_heldout(q.qid):
            held_q[q.qid] = q.text
            held_rels[q.qid] = {trec.pids[r]: 1 for r in rows}
            continue
        for r in rng.sample(rows, min(max_pairs_per_query, len(rows))):
            anchors.append(q.text)
            positives.append(trec.passages[r])
            groups.append(f"entity:{q.qid}")
        if hard_negatives:
            near = set().union(*(words.get(w, set()) for n in q.names for w in _WORD.findall(n))) - set(rows)
            if near:
                picked = rng.sample(sorted(near), min(negatives_per_query, len(near)))
                negatives[f"entity:{q.qid}"] = [trec.passages[r] for r in picked]
    return ObjectiveData(
        "entity",
        PairSet(anchors, positives, groups, negatives),
        HeldOut("entity", queries=held_q, qrels=held_rels),
        {
            "pairs": len(anchors),
            "train_queries": len(set(groups)),
            "heldout_queries": len(held_q),
            "max_df": max_df,
            "hard_negative_queries": len(negatives),
        },
    )


def build_intent(ctx: DataContext, *, classes: Any = "3") -> ObjectiveData:
    data = load_orcas(ctx.data_dir, classes)
    sp = ctx.split
    if sp.intent_folds is not None:
        if not 0 <= sp.intent_fold < sp.intent_folds:
            raise ValueError(f"split.intent_fold must be in [0, {sp.intent_folds - 1}], got {sp.intent_fold}")
        folds = stratified_folds(list(data.qids), list(data.labels), sp.intent_folds)
        held = [f == sp.intent_fold for f in folds]
    else:
        frac = sp.intent_heldout_fraction
        if not 0 < frac < 1:
            raise ValueError(f"split.intent_heldout_fraction must be in (0, 1), got {frac!r}")
        held = [_hash_fraction(f"orcas:{qid}") < frac for qid in data.qids]
    tr_t, tr_l, ho_t, ho_l = [], [], [], []
    for is_held, text, label in zip(held, data.texts, data.labels, strict=True):
        if is_held:
            ho_t.append(text)
            ho_l.append(label)
        else:
            tr_t.append(text)
            tr_l.append(label)
    return ObjectiveData(
        "intent",
        ClassSet(tr_t, tr_l, data.classes),
        HeldOut("classification", texts=ho_t, labels=ho_l),
        {"train": len(tr_t), "heldout": len(ho_t), "classes": data.classes},
    )


BUILDERS: dict[str, Callable[..., ObjectiveData]] = {
    "semantic": build_semantic,
    "entity": build_entity,
    "intent": build_intent,
}


def build_objective(kind: str, ctx: DataContext, **params: Any) -> ObjectiveData:
    return build("objective data", BUILDERS, kind, ctx, **params)
