"""Held-out metrics per objective, computed on queries/texts the trainer never sees.

- ``retrieval`` (semantic): NDCG@10 (linear gains, as trec_eval's ``ndcg_cut_10``) over the
  eval corpus, ranking by the objective's own block (the full vector for ``single_head``).
- ``entity``: ``entity_p@10``, the fraction of the top-10 passages that mention one of the
  query's linked entities, and ``entity_hit@10`` (at least one does).
- ``classification`` (intent): macro-F1 and accuracy of the cosine classifier.

Each objective reports a ``main`` metric (the one the "improves over the untrained start"
check reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from training.data.objectives import HeldOut

MAIN = {"retrieval": "ndcg@10", "entity": "entity_p@10", "classification": "macro_f1"}


def ndcg_at_k(ranked: Sequence[str], rels: dict[str, int], k: int = 10) -> float:
    gains = [rels.get(d, 0) for d in ranked[:k]]
    dcg = sum(g / np.log2(i + 2) for i, g in enumerate(gains))
    ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / np.log2(i + 2) for i, g in enumerate(ideal))
    return float(dcg / idcg) if idcg > 0 else 0.0


def macro_f1(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int) -> float:
    t, p = np.asarray(y_true), np.asarray(y_pred)
    f1s = []
    for c in range(n_classes):
        tp = int(((p == c) & (t == c)).sum())
        fp = int(((p == c) & (t != c)).sum())
        fn = int(((p != c) & (t == c)).sum())
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1s))


def _topk(q: np.ndarray, docs: np.ndarray, k: int) -> np.ndarray:
    scores = q @ docs.T
    k = min(k, docs.shape[0])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


def evaluate_heldout(
    heldout: HeldOut,
    embed: Callable[[list[str]], np.ndarray],
    *,
    corpus_ids: Sequence[str],
    corpus_vecs: np.ndarray | None,
    intent_probs: Callable[[list[str]], np.ndarray] | None = None,
    n_classes: int = 0,
    k: int = 10,
) -> dict[str, float]:
    """Metrics for one objective. ``embed`` returns the objective's vectors ``(n, d)``, normalised;
    ``corpus_vecs`` are the corpus rows' vectors in the same space."""
    if heldout.kind == "classification":
        if intent_probs is None:
            raise ValueError("classification held-out metrics need intent_probs")
        pred = intent_probs(heldout.texts).argmax(1)
        acc = float((pred == np.asarray(heldout.labels)).mean()) if heldout.labels else 0.0
        return {
            "macro_f1": macro_f1(heldout.labels, pred.tolist(), n_classes),
            "accuracy": acc,
            "main": macro_f1(heldout.labels, pred.tolist(), n_classes),
            "n": len(heldout.texts),
        }
    if corpus_vecs is None:
        raise ValueError(f"{heldout.kind} held-out metrics need corpus vectors")
    qids = list(heldout.queries)
    top = _topk(embed([heldout.queries[q] for q in qids]), corpus_vecs, k)
    ids = np.asarray(corpus_ids)
    if heldout.kind == "retrieval":
        vals = [ndcg_at_k(list(ids[row]), heldout.qrels[q], k) for q, row in zip(qids, top, strict=True)]
        return {"ndcg@10": float(np.mean(vals)), "main": float(np.mean(vals)), "n": len(qids)}
    if heldout.kind == "entity":
        frac = [np.mean([d in heldout.qrels[q] for d in ids[row]]) for q, row in zip(qids, top, strict=True)]
        hit = [float(any(d in heldout.qrels[q] for d in ids[row])) for q, row in zip(qids, top, strict=True)]
        return {
            "entity_p@10": float(np.mean(frac)),
            "entity_hit@10": float(np.mean(hit)),
            "main": float(np.mean(frac)),
            "n": len(qids),
        }
    raise ValueError(f"held-out kind {heldout.kind!r} is invalid; allowed: {sorted(MAIN)}")
