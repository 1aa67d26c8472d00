"""Inner validation of the learned term weights (``sparse.term_weights``) inside the training years.

``esp eval`` fits the term weights of a run on the training year (the year it does not hold
out). Choosing their settings on the evaluation queries would be tuning on the test set, so this
script never reads a held-out year: for each held-out year it takes the other year's training
queries (:meth:`TermTrainingData.from_context`), splits them in two halves by a hash of the qid,
fits on one half and scores the BM25 block alone, BM25's and learned, on the other: NDCG@10 over
the judged queries of that half, entity P@10 over its queries with DL-HARD links. Prints one JSON
line per (held-out year, half, candidate) and one with each candidate's means.

Usage: python bench/term_weights_cv.py --candidate NAME=JSON ...
       (JSON: TermWeightsSpec fields, e.g. relevance='{"entity_weight": 0}')
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esp_retrieval.subspace.metrics import ndcg_at_k
from esp_retrieval.subspace.sparse import SparseLexical
from esp_retrieval.training.config import TermWeightsSpec
from esp_retrieval.training.data import DEFAULT_DATA_DIR
from esp_retrieval.training.data.objectives import DataContext, Split
from esp_retrieval.training.evaluate.benchmark import DLBench, load_dl
from esp_retrieval.training.sparse_lexical import build_bm25
from esp_retrieval.training.term_weights import TermTrainingData, learn_term_weights


def _half(qid: str) -> int:
    return int(hashlib.sha1(qid.encode()).hexdigest()[:8], 16) % 2


def _subset(data: TermTrainingData, keep: set[str]) -> TermTrainingData:
    return TermTrainingData({q: t for q, t in data.queries.items() if q in keep},
                            {q: r for q, r in data.qrels.items() if q in keep},
                            {q: e for q, e in data.entities.items() if q in keep})


def scores(bench: DLBench, block: SparseLexical, data: TermTrainingData, qids: list[str]) -> dict[str, float]:
    """The block alone: mean NDCG@10 (judged queries) and entity P@10 (linked queries) of ``qids``."""
    texts = [data.queries.get(q) or data.entities[q][0] for q in qids]
    top = np.argsort(-block.scores(block.encode(texts)), axis=1, kind="stable")[:, :10]
    ndcg, ent = [], []
    for q, rows in zip(qids, top, strict=True):
        rel = data.qrels.get(q, {})
        if any(g > 0 for g in rel.values()):
            ndcg.append(ndcg_at_k([bench.pids[r] for r in rows], rel))
        if bench.entities.get(q):
            ent.append(float(np.mean([bench.mentions(q, int(r)) for r in rows])))
    return {"ndcg@10": float(np.mean(ndcg)), "entity_p@10": float(np.mean(ent)),
            "n_ndcg": len(ndcg), "n_entity": len(ent)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--candidate", action="append", default=[],
                        help="NAME=JSON of TermWeightsSpec fields")
    args = parser.parse_args(argv)
    candidates = {c.split("=", 1)[0]: TermWeightsSpec(**json.loads(c.split("=", 1)[1]))
                  for c in args.candidate or ["default={}"]}
    data_dir = Path(args.data_dir)
    bench = load_dl(data_dir / "trec-dl-2019-2020-passage")
    block = build_bm25(bench.texts)
    deltas: dict[str, list[tuple[float, float]]] = {n: [] for n in candidates}
    for heldout in ("dl20", "dl19"):
        data = TermTrainingData.from_context(DataContext(data_dir, Split(by="year", heldout_year=heldout)))
        for half in (0, 1):
            fit = _subset(data, {q for q in data.qids if _half(q) != half})
            val = sorted(q for q in data.qids if _half(q) == half)
            base = scores(bench, block, data, val)
            for name, spec in candidates.items():
                learned = learn_term_weights(block, bench.pids, bench.texts, fit, spec)
                got = scores(bench, learned.block, data, val)
                deltas[name].append((got["ndcg@10"] - base["ndcg@10"],
                                     got["entity_p@10"] - base["entity_p@10"]))
                theta = [round(float(x), 3) for x in learned.theta]
                print(json.dumps({"heldout": heldout, "half": half, "candidate": name, "bm25": base,
                                  "learned": got, "theta": theta}), flush=True)
    print(json.dumps({n: {"mean_delta_ndcg@10": float(np.mean([d[0] for d in v])),
                          "mean_delta_entity_p@10": float(np.mean([d[1] for d in v])),
                          "min_delta_ndcg@10": float(min(d[0] for d in v))} for n, v in deltas.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
