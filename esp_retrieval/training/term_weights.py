"""Learned term weights on top of BM25: a per-term multiplier fitted on the training queries.

BM25 weighs a query term by its idf alone. Learned term weighting (DeepCT, Dai and Callan 2020;
the term-weight features of Bendersky et al. 2010, "Learning concept importance using a weighted
dependence model") learns how much a term matters from what it is. Here a term ``t`` of the
vocabulary gets

    a_t = exp(theta . phi(t))        phi(t): (F,) standardised features (:data:`FEATURES`)

and the block's document side becomes ``a_t * idf(t) * saturated tf(t, d)`` (its ``idf`` becomes
``a_t * idf(t)``, so a query's score still lies in ``[0, 1)``). The block stays one exact sparse
dot product, served and stored as before (:class:`esp_retrieval.subspace.sparse.SparseLexical`);
``theta = 0`` is BM25 itself, and an L2 penalty pulls towards it.

``theta`` is fitted (full batch, Adam, deterministic: it does not depend on the run's seed) with
a listwise softmax (ListNet, Cao et al. 2007) over the block's exact scores of each training
query's BM25 top-``candidates`` (plus its judged passages):

- relevance: target ``proportional to 2^grade - 1`` of the graded qrels;
- entity: target uniform over the candidates that mention one of the query's DL-HARD gold
  entities (surface form or Wikipedia title), weighted ``entity_weight`` against relevance's 1
  (each objective as a whole). Off by default: in a validation inside the training years
  (``bench/term_weights_cv.py``) relevance alone raised the block's entity P@10 more than with it.

Only the training queries are read (:meth:`TermTrainingData.from_context` drops every query
the split holds out). MIMICS is not used: its pairs (query -> refined query) judge no passage,
so a document-side term weight would only learn from BM25's own ranking, and the evaluation
holds MIMICS out for keyword clustering. Shapes: ``Q`` training lists of ``K`` candidates and
``T`` query terms (padded), ``F`` features, ``V`` terms.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from esp_retrieval.subspace.sparse import TOKEN, SparseLexical, tokenize
from esp_retrieval.training.config import TermWeightsSpec
from esp_retrieval.training.data.dlhard import find_mentions, load_entity_queries
from esp_retrieval.training.data.objectives import DataContext

_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class TermTrainingData:
    """What the term weights train on: training queries only, never a held-out one."""

    queries: dict[str, str]  # qid -> text (graded qrels)
    qrels: dict[str, dict[str, int]]  # qid -> pid -> grade
    entities: dict[str, tuple[str, tuple[str, ...]]]  # qid -> (text, lower-cased entity names)

    @classmethod
    def from_context(cls, ctx: DataContext) -> TermTrainingData:
        """The training queries of ``ctx``'s split (the semantic and entity objectives' own)."""
        queries = {q: t for q, t in ctx.all_queries().items() if not ctx.is_heldout(q)}
        qrels = {q: ctx.trec.qrels[q] for q in queries if q in ctx.trec.qrels}
        entities = {e.qid: (e.text, e.names) for e in load_entity_queries(ctx.data_dir)
                    if e.names and not ctx.is_heldout(e.qid)}
        return cls(queries, qrels, entities)

    @property
    def qids(self) -> set[str]:
        return set(self.queries) | set(self.entities)


@dataclass(frozen=True)
class TermContext:
    """What a feature reads: the block, its corpus texts and the training data."""

    block: SparseLexical
    texts: Sequence[str]
    data: TermTrainingData


def _capitalised(c: TermContext) -> np.ndarray:
    """Share of the term's corpus occurrences written with a capital first letter (names)."""
    col = {t: i for i, t in enumerate(c.block.vocab)}
    caps, total = np.zeros(len(col)), np.zeros(len(col))
    for text in c.texts:
        for tok in TOKEN.findall(text):
            i = col.get(tok.lower())
            if i is not None:
                total[i] += 1
                caps[i] += tok[0].isupper()
    return caps / np.maximum(total, 1)


def _entity_name(c: TermContext) -> np.ndarray:
    """1 for a term of a training query's gold entity names, else 0."""
    terms = {t for _, names in c.data.entities.values() for n in names for t in tokenize(n)}
    return np.array([t in terms for t in c.block.vocab], dtype=np.float64)


#: term feature name -> ``(V,)`` raw values (standardised before use)
FEATURES: dict[str, Callable[[TermContext], np.ndarray]] = {
    "idf": lambda c: c.block.idf.astype(np.float64),
    "log_length": lambda c: np.log([len(t) for t in c.block.vocab]),
    "numeric": lambda c: np.array([bool(_DIGIT.search(t)) for t in c.block.vocab], dtype=np.float64),
    "capitalised": _capitalised,
    "entity_name": _entity_name,
}


def term_features(c: TermContext, names: Sequence[str]) -> np.ndarray:
    """``(V, F)`` standardised features (a constant feature is all 0: it would only rescale)."""
    bad = sorted(set(names) - set(FEATURES))
    if bad:
        raise ValueError(f"unknown term features {bad}; allowed: {sorted(FEATURES)}")
    cols = []
    for n in names:
        x = np.asarray(FEATURES[n](c), dtype=np.float64)
        sd = x.std()
        cols.append((x - x.mean()) / sd if sd > 0 else np.zeros_like(x))
    return np.stack(cols, axis=1) if cols else np.zeros((len(c.block.vocab), 0))


@dataclass(frozen=True)
class Lists:
    """``Q`` padded training lists: query terms, candidate term weights and targets."""

    cols: torch.Tensor  # (Q, T) long: the terms' columns (padding 0)
    counts: torch.Tensor  # (Q, T) float64: the query's term weights (padding 0)
    docs: torch.Tensor  # (Q, K, T) float64: candidates' BM25 weights of the query's terms
    target: torch.Tensor  # (Q, K) float64: sums to 1 per list (padding 0)
    valid: torch.Tensor  # (Q, K) bool: a real candidate
    weight: torch.Tensor  # (Q,) float64: its objective's weight over the objective's number of lists


def block_scores(lists: Lists, idf: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
    """``(Q, K)`` the learned block's exact scores of each list's candidates:
    ``sum_t c_t a_t w_td / sum_t c_t a_t idf_t`` (what :meth:`SparseLexical.scores` gives)."""
    qa = lists.counts * multiplier[lists.cols]
    top = (qa * idf[lists.cols]).sum(-1, keepdim=True)
    return (lists.docs * qa[:, None, :]).sum(-1) / top.clamp_min(1e-12)


def build_lists(block: SparseLexical, pids: Sequence[str], texts: Sequence[str], data: TermTrainingData,
                spec: TermWeightsSpec) -> Lists:
    """One list per training query with judged-relevant candidates, one per training entity
    query with a mentioning candidate (BM25 top-``spec.candidates``; relevance adds the judged).
    Each objective weighs as a whole (relevance 1, entity ``spec.entity_weight``), whatever its
    number of lists: DL-HARD links most of a year's 200 queries, NIST judged 43-54 of them."""
    row = {p: i for i, p in enumerate(pids)}
    weight = {"relevance": 1.0, "entity": spec.entity_weight}
    # (query text, row -> gain, objective, rows added to the BM25 top-k: the judged ones)
    items: list[tuple[str, dict[int, float], str, list[int]]] = []
    for qid, text in sorted(data.queries.items()):
        judged = {row[p]: 2.0 ** g - 1 for p, g in data.qrels.get(qid, {}).items() if p in row}
        items.append((text, judged, "relevance", sorted(judged)))
    ent = sorted(data.entities.items())
    if spec.entity_weight > 0 and ent:
        mentions = find_mentions([names for _, (_, names) in ent], texts)
        items += [(text, dict.fromkeys(m, 1.0), "entity", [])
                  for (_, (text, _)), m in zip(ent, mentions, strict=True)]
    enc = block.encode([it[0] for it in items])
    top = np.argsort(-block.scores(enc), axis=1, kind="stable")[:, :spec.candidates]
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]] = []
    for i, (_, gains, kind, extra) in enumerate(items):
        q = enc[i]
        cand = np.union1d(top[i], np.asarray(extra, dtype=np.int64))
        g = np.array([gains.get(int(r), 0.0) for r in cand])
        if q.nnz == 0 or g.sum() <= 0:
            continue
        d = np.asarray(block.docs[cand][:, q.indices].toarray(), dtype=np.float64)
        rows.append((q.indices, q.data, d, g / g.sum(), kind))
    n_lists = Counter(r[4] for r in rows)
    n_q = len(rows)
    k = max((len(r[3]) for r in rows), default=1)
    t = max((len(r[0]) for r in rows), default=1)
    cols, counts = np.zeros((n_q, t), np.int64), np.zeros((n_q, t))
    docs, target, valid = np.zeros((n_q, k, t)), np.zeros((n_q, k)), np.zeros((n_q, k), bool)
    for i, (c, v, d, g, _) in enumerate(rows):
        cols[i, :len(c)], counts[i, :len(c)] = c, v
        docs[i, :d.shape[0], :d.shape[1]] = d
        target[i, :len(g)], valid[i, :len(g)] = g, True
    return Lists(torch.from_numpy(cols), torch.from_numpy(counts), torch.from_numpy(docs),
                 torch.from_numpy(target), torch.from_numpy(valid),
                 torch.tensor([weight[r[4]] / n_lists[r[4]] for r in rows], dtype=torch.float64))


def listwise_loss(lists: Lists, idf: torch.Tensor, multiplier: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """Weighted mean over lists of the cross-entropy of the targets and the softmax of the scores."""
    logits = (block_scores(lists, idf, multiplier) / temperature).masked_fill(~lists.valid, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1).masked_fill(~lists.valid, 0.0)
    return ((-(lists.target * logp).sum(-1)) * lists.weight).sum() / lists.weight.sum().clamp_min(1e-12)


@dataclass(frozen=True)
class LearnedTerms:
    block: SparseLexical  # the reweighted block
    multiplier: np.ndarray  # (V,) a_t
    theta: np.ndarray  # (F,)
    stats: dict[str, Any]


def reweight(block: SparseLexical, multiplier: np.ndarray, provenance: Mapping[str, Any]) -> SparseLexical:
    """``block`` with column ``t`` of its documents and its idf multiplied by ``multiplier[t]``."""
    a = np.asarray(multiplier, dtype=np.float32)
    docs = block.docs.copy()
    docs.data = (docs.data * a[docs.indices]).astype(np.float32)
    return SparseLexical(sp.csr_matrix(docs), block.vocab, (block.idf * a).astype(np.float32),
                         {**block.params, "term_weights": dict(provenance)})


def learn_term_weights(block: SparseLexical, pids: Sequence[str], texts: Sequence[str],
                       data: TermTrainingData, spec: TermWeightsSpec) -> LearnedTerms:
    """Fit ``theta`` on ``data`` (training queries only) and fold ``a_t`` into ``block``
    (rows: ``pids`` with their ``texts``, in the block's order)."""
    names = list(spec.features) if spec.features is not None else list(FEATURES)
    phi = torch.from_numpy(term_features(TermContext(block, texts, data), names))
    lists = build_lists(block, pids, texts, data, spec)
    if not len(lists.weight):  # nothing to fit: theta would stay 0, plain BM25 under another name
        raise ValueError(
            f"sparse.term_weights: nothing to learn from: none of the {len(data.queries)} training "
            f"queries (and {len(data.entities)} entity-linked ones) has a judged or entity-matching "
            "passage in the corpus; give the run qrels or DL-HARD entity links, or drop sparse.term_weights"
        )
    idf = torch.from_numpy(block.idf.astype(np.float64))
    theta = torch.zeros(len(names), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=spec.lr)

    def loss_at() -> torch.Tensor:
        return listwise_loss(lists, idf, torch.exp(phi @ theta), spec.temperature)

    with torch.no_grad():
        start = float(loss_at())
    for _ in range(spec.steps):
        opt.zero_grad()
        (loss_at() + spec.l2 * (theta ** 2).sum()).backward()
        opt.step()
    with torch.no_grad():
        end = float(loss_at())
        a = torch.exp(phi @ theta).numpy()
    th = theta.detach().numpy().copy()
    stats = {"lists": len(lists.weight), "loss_start": start, "loss_end": end}
    provenance = {"features": names, "theta": [float(x) for x in th], **stats}
    return LearnedTerms(reweight(block, a, provenance), a, th, stats)
