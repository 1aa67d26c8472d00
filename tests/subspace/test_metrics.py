"""IR and clustering metrics against hand-computed values, scikit-learn, and trec_eval's published
BM25 numbers on the shipped pool."""

from __future__ import annotations

import gzip
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.subspace import metrics as m

DL = Path(__file__).resolve().parents[2] / "data" / "trec-dl-2019-2020-passage"


def test_ndcg_linear_gain_and_ideal_from_all_judgements() -> None:
    # DCG = 1/log2(2) + 0 + 3/log2(4) = 2.5; IDCG over grades (3, 2, 1) = 3 + 2/log2(3) + 1/2.
    qrels = {"d1": 1, "d3": 3, "d4": 2, "d5": 0}
    got = m.ndcg_at_k(["d1", "d2", "d3"], qrels, k=10)
    assert got == pytest.approx(2.5 / (3 + 2 / math.log2(3) + 0.5), abs=1e-12)
    assert got == pytest.approx(0.5250044, abs=1e-6)


def test_ndcg_cut_and_edge_cases() -> None:
    qrels = {"a": 2, "b": 2}
    assert m.ndcg_at_k(["a", "b"], qrels) == pytest.approx(1.0)
    # Cut at 1: the relevant doc at rank 2 no longer counts.
    assert m.ndcg_at_k(["x", "a"], qrels, k=1) == 0.0
    assert m.ndcg_at_k(["a"], {"a": 0}) == 0.0  # no positive judgement
    with pytest.raises(ValueError, match="k must be"):
        m.ndcg_at_k(["a"], qrels, k=0)


def test_precision_divides_by_k() -> None:
    assert m.precision_at_k([True, False, True, True], k=10) == pytest.approx(0.3)
    assert m.precision_at_k([True] * 12, k=10) == 1.0
    assert m.precision_at_k([False, True], k=1) == 0.0


def _bm25_ndcg(year: str) -> float:
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for line in (DL / f"qrels.{year}-passage.txt").read_text().splitlines():
        qid, _, pid, grade = line.split()
        qrels[qid][pid] = int(grade)
    runs: dict[str, list[tuple[int, str]]] = defaultdict(list)
    with gzip.open(DL / "pool.tsv.gz", "rt") as f:
        next(f)
        for line in f:
            y, qid, retriever, rank, pid, _ = line.rstrip("\n").split("\t")
            if y == year and retriever == "BM25":
                runs[qid].append((int(rank), pid))
    scores = [m.ndcg_at_k([p for _, p in sorted(r)], qrels[q]) for q, r in runs.items()]
    return float(np.mean(scores))


def test_ndcg_matches_trec_eval_bm25_on_shipped_pool() -> None:
    # Anserini's published BM25 (default) nDCG@10 from trec_eval: 0.5058 (DL19), 0.4796 (DL20).
    assert _bm25_ndcg("dl19") == pytest.approx(0.5058, abs=5e-5)
    assert _bm25_ndcg("dl20") == pytest.approx(0.4796, abs=5e-5)


def test_macro_f1_by_hand_and_against_sklearn() -> None:
    from sklearn.metrics import f1_score

    t = ["a", "a", "b", "b", "c"]
    p = ["a", "b", "b", "b", "a"]
    # a: 2*1/(2+1+1) = .5; b: 4/5 = .8; c: 0  -> 1.3 / 3
    assert m.macro_f1(t, p, ["a", "b", "c"]) == pytest.approx(1.3 / 3)
    assert m.macro_f1(t, p, ["a", "b", "c"]) == pytest.approx(
        f1_score(t, p, labels=["a", "b", "c"], average="macro", zero_division=0)
    )
    with pytest.raises(ValueError, match="items"):
        m.macro_f1(t, p[:2], ["a"])


def test_cluster_metrics() -> None:
    classes = ["x", "x", "y", "y", "y", "z"]
    clusters = [0, 0, 0, 1, 1, -1]
    assert m.purity(classes, clusters) == pytest.approx(4 / 5)
    assert m.purity(classes, clusters, noise=None) == pytest.approx(5 / 6)
    assert math.isnan(m.purity(["a"], [-1]))
    # singletons are pure by construction; min_size=2 scores only the groups: {x, x, y} and {y, y}
    with_singletons = ["x", "x", "y", "y", "y", "z", "q"], [0, 0, 0, 1, 1, 2, 3]
    assert m.purity(*with_singletons) == pytest.approx(6 / 7)
    assert m.purity(*with_singletons, min_size=2) == pytest.approx(4 / 5)
    assert math.isnan(m.purity(["a", "b"], [0, 1], min_size=2))
    assert m.normalized_mutual_info(classes, [0, 0, 1, 1, 1, 2]) == pytest.approx(1.0)
    assert m.adjusted_rand(classes, [5, 5, 7, 7, 7, 9]) == pytest.approx(1.0)
    # Noise as singletons: the lone z in noise is still "its own cluster".
    assert m.adjusted_rand(classes, [0, 0, 1, 1, 1, -1]) == pytest.approx(1.0)
    assert m.adjusted_rand(classes, [0, 0, 0, 0, 0, 0]) == pytest.approx(0.0)


def test_macro_f1_edge_cases() -> None:
    assert m.macro_f1([], [], [0, 1]) == 0.0
    assert m.macro_f1([0, 0], [0, 0], range(3)) == pytest.approx(1 / 3)  # absent classes score 0
    with pytest.raises(ValueError, match="labels"):
        m.macro_f1([0], [0], [])


def test_purity_equals_the_per_cluster_majority_count() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        classes = rng.choice(["a", "b", "c", "d"], size=200).tolist()
        clusters = rng.integers(-1, 30, size=200)
        kept = clusters != -1
        majority = sum(
            np.unique(np.asarray(classes)[clusters == c], return_counts=True)[1].max()
            for c in np.unique(clusters[kept])
        )
        assert m.purity(classes, clusters) == majority / kept.sum()
