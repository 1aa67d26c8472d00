"""Held-out metrics per objective, computed on queries/texts the trainer never sees.

- ``retrieval`` (semantic): NDCG@10 (linear gains, as trec_eval's ``ndcg_cut_10``) over the
  eval corpus, ranking by the objective's own block (the full vector for ``single_head``).
- ``entity``: ``entity_p@10``, the fraction of the top-10 passages that mention one of the
  query's linked entities (trec_eval's P_10: divided by 10), and ``entity_hit@10`` (at least
  one does).
- ``classification`` (intent): macro-F1 and accuracy of the cosine classifier.

Rankings go through the engine's numpy backend (:func:`engine_topk`), so held-out numbers rank
exactly as the service does: the exact float64 top k, ties to the lower row. The metrics are
:mod:`subspace.metrics`. Each objective reports a ``main`` metric (the one the "improves over the
untrained start" check reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.metrics import macro_f1, ndcg_at_k, precision_at_k
from esp_retrieval.training.data.objectives import HeldOut

MAIN = {"retrieval": "ndcg@10", "entity": "entity_p@10", "classification": "macro_f1"}


def engine_topk(
    queries: np.ndarray, corpus: np.ndarray, layout: SubspaceLayout, block_weights: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` ``(scores (nq, k'), rows (nq, k'))`` of block-normalised ``queries (nq, D)`` in
    ``corpus (N, D)`` at ``block_weights`` ``(K,)`` or ``(nq, K)``, by the service's engine
    (:class:`~esp_retrieval.subspace.engine.numpy_backend.NumpyBackend`): ``k' = min(k, N)``, descending, ties
    to the lower row. A corpus that is neither float32 nor float16 is scanned as float32."""
    data = corpus if corpus.dtype in (np.float32, np.float16) else corpus.astype(np.float32)
    engine = NumpyBackend(np.ascontiguousarray(data), layout)
    try:
        res = engine.search(queries, block_weights, k)
    finally:
        engine.close()
    return res.scores, res.rows


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
        f1 = macro_f1(heldout.labels, pred.tolist(), range(n_classes))
        return {"macro_f1": f1, "accuracy": acc, "main": f1, "n": len(heldout.texts)}
    if corpus_vecs is None:
        raise ValueError(f"{heldout.kind} held-out metrics need corpus vectors")
    qids = list(heldout.queries)
    one_block = SubspaceLayout.from_dims({heldout.kind: corpus_vecs.shape[1]})
    top = (
        engine_topk(embed([heldout.queries[q] for q in qids]), corpus_vecs, one_block, np.ones(1), k)[1]
        if qids
        else np.empty((0, k), np.int64)
    )
    ids = np.asarray(corpus_ids)
    if heldout.kind == "retrieval":
        vals = [ndcg_at_k(list(ids[row]), heldout.qrels[q], k) for q, row in zip(qids, top, strict=True)]
        return {"ndcg@10": float(np.mean(vals)), "main": float(np.mean(vals)), "n": len(qids)}
    if heldout.kind == "entity":
        hits = [[d in heldout.qrels[q] for d in ids[row]] for q, row in zip(qids, top, strict=True)]
        frac = [precision_at_k(h, k) for h in hits]
        return {
            "entity_p@10": float(np.mean(frac)),
            "entity_hit@10": float(np.mean([any(h) for h in hits])),
            "main": float(np.mean(frac)),
            "n": len(qids),
        }
    raise ValueError(f"held-out kind {heldout.kind!r} is invalid; allowed: {sorted(MAIN)}")
