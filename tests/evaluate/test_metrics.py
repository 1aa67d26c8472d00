"""Metrics against hand-computed values (and trec_eval's published BM25 numbers on the shipped pool)."""

from __future__ import annotations

import gzip
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from training.evaluate import metrics as m

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


def test_wikipedia_title_and_mentions() -> None:
    assert m.wikipedia_title("https://en.wikipedia.org/wiki/Talent_manager") == "talent manager"
    assert m.wikipedia_title("https://en.wikipedia.org/wiki/Mercury_(planet)") == "mercury"
    assert m.wikipedia_title("https://en.wikipedia.org/wiki/Caf%C3%A9") == "café"
    assert m.entity_mentioned("Bluetooth and WiFi compared", ["wifi"])
    assert m.entity_mentioned("The USPS. ships", ["usps"])
    assert not m.entity_mentioned("a shared workspace", ["space"])
    assert not m.entity_mentioned("anything", ["", "  "])


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


def test_intent_agreement() -> None:
    labels = ["n", "n", "t", "t", "n"]
    neighbours = np.array([[1, 2], [0, 4]])  # item 0 -> (n, t); item 1 -> (n, n)
    assert m.intent_agreement_at_k(labels, neighbours, [0, 1]) == pytest.approx(0.75)


def test_kendall_tau() -> None:
    # 5 concordant, 1 discordant pair of 6.
    assert m.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert m.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(m.kendall_tau([1, 1, 1], [1, 2, 3]))


def test_effective_rank() -> None:
    assert m.effective_rank(np.eye(5)) == pytest.approx(5.0)
    assert m.effective_rank(np.outer(np.arange(1, 4), np.arange(1, 6))) == pytest.approx(1.0)
    p = np.array([0.75, 0.25])
    assert m.effective_rank(np.diag([3.0, 1.0])) == pytest.approx(math.exp(-np.sum(p * np.log(p))))


def test_pareto_front_and_hypervolume() -> None:
    pts = np.array([[0.5, 0.5], [0.8, 0.2], [0.2, 0.9], [0.4, 0.4], [0.5, 0.5]])
    front = m.pareto_front(pts)
    assert sorted(front.tolist()) == [0, 1, 2, 4]
    assert pts[front, 0].tolist() == sorted(pts[front, 0].tolist())
    # Strips from the right: .8*.2 + .5*.3 + .2*.4
    assert m.hypervolume_2d(pts) == pytest.approx(0.39)
    # Only (0.5, 0.5) clears (0.3, 0.3) in both coordinates.
    assert m.hypervolume_2d(pts, ref=(0.3, 0.3)) == pytest.approx(0.2 * 0.2)
    assert m.hypervolume_2d(np.array([[0.1, 0.1]]), ref=(0.2, 0.0)) == 0.0


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
