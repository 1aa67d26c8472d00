"""Scoring through the service path on a hand-built benchmark with known NDCG@10 and precision@10."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.training.evaluate.benchmark import DLBench
from esp_retrieval.training.evaluate.evaluator import Features, ZeroShot, evaluate_model
from esp_retrieval.training.evaluate.retrieval import (
    label_conflict,
    neighbours,
    ranking_conflict,
    score_dl,
    simplex_grid,
)

LAYOUT = SubspaceLayout.from_dims({"semantic": 2, "entity": 2})


def _bench() -> DLBench:
    texts = [
        "how tall is the tower",  # p0
        "tower heights compared",  # p1
        "The Eiffel Tower in Paris",  # p2: mentions the entity
        "eiffel tower tickets",  # p3: mentions the entity
    ]
    return DLBench(
        pids=["p0", "p1", "p2", "p3"],
        texts=texts,
        queries={"dl19": {"q1": "eiffel tower height"}, "dl20": {}},
        qrels={"dl19": {"q1": {"p0": 3, "p1": 1, "p2": 2, "p3": 0, "p9": 1}}, "dl20": {}},
        entities={"q1": ("eiffel tower",)},
        pool={"q1": ["p0", "p1", "p2", "p3"]},
    )


# Semantic block cosines with the query: p0 > p1 > p2 > p3; entity block: p3 > p2 > p1 > p0.
def _angles(order: list[int]) -> np.ndarray:
    out = np.zeros((4, 2))
    for rank, row in enumerate(order):
        a = 0.3 * rank
        out[row] = [math.cos(a), math.sin(a)]
    return out


CORPUS = normalize_blocks(np.hstack([_angles([0, 1, 2, 3]), _angles([3, 2, 1, 0])]).astype(np.float32), LAYOUT)
QUERY = {"q1": np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)}


def test_semantic_weights_give_the_known_ndcg_and_precision() -> None:
    s = score_dl(_bench(), CORPUS, QUERY, LAYOUT, weights={"semantic": 1.0, "entity": 0.0}, year="dl19")
    # Ranking p0 (3), p1 (1), p2 (2), p3 (0): DCG = 3 + 1/log2(3) + 2/2; ideal 3, 2, 1, 1 (p9 is judged
    # but not in the corpus: it still counts in the ideal ranking, as in trec_eval).
    dcg = 3 + 1 / math.log2(3) + 1.0
    idcg = 3 + 2 / math.log2(3) + 1 / 2 + 1 / math.log2(5)
    assert s.ndcg == pytest.approx(dcg / idcg)
    assert s.per_query_entity_p == {"q1": pytest.approx(0.2)}  # p2, p3 of the 10 ranks


def test_entity_weights_flip_the_ranking() -> None:
    s = score_dl(_bench(), CORPUS, QUERY, LAYOUT, weights={"semantic": 0.0, "entity": 1.0}, year="dl19")
    # p3 (0), p2 (2), p1 (1), p0 (3)
    dcg = 0 + 2 / math.log2(3) + 1 / 2 + 3 / math.log2(5)
    idcg = 3 + 2 / math.log2(3) + 1 / 2 + 1 / math.log2(5)
    assert s.ndcg == pytest.approx(dcg / idcg)
    assert s.entity_p == pytest.approx(0.2)


def test_conflict_proxies() -> None:
    b = _bench()
    # Exactly reversed per-block orders over the pool: tau = -1.
    assert ranking_conflict(b, CORPUS, QUERY, LAYOUT, first="semantic", second="entity", qids=["q1"]) == (
        pytest.approx(-1.0)
    )
    # Grades (3, 1, 2, 0) vs mentions (0, 0, 1, 1) over the judged passages in the corpus.
    from scipy.stats import kendalltau

    want = kendalltau([3, 1, 2, 0], [0, 0, 1, 1]).statistic
    assert label_conflict(b, "dl19") == pytest.approx(want)


def test_simplex_grid() -> None:
    g = simplex_grid(["a", "b", "c"], 0.5)
    assert len(g) == 6
    assert all(sum(w.values()) == pytest.approx(1.0) for w in g)
    assert len(simplex_grid(["a", "b", "c"], 0.1)) == 66
    with pytest.raises(ValueError, match="step"):
        simplex_grid(["a"], 0.3)


def test_neighbours_exclude_self() -> None:
    emb = normalize_blocks(np.array([[1, 0, 1, 0], [1, 0.1, 1, 0], [0, 1, 0, 1]], dtype=np.float32), LAYOUT)
    nb = neighbours(emb, LAYOUT, None, [0, 2], k=1)
    assert nb.tolist() == [[1], [1]]


def test_evaluate_zero_shot_end_to_end() -> None:
    b = _bench()
    rng = np.random.default_rng(0)
    feats = Features(
        corpus=CORPUS, queries=QUERY, orcas=rng.standard_normal((12, 4)).astype(np.float32),
        mimics=np.zeros((0, 4), dtype=np.float32),
    )
    labels = [0, 1] * 6
    zs = ZeroShot(hidden=4).fit_centroids(feats.orcas[:8], labels[:8], 2)
    ev = evaluate_model(zs, feats, b, eval_year="dl19", orcas_labels=labels, orcas_test=range(8, 12),
                        sweep=[{"shared": 1.0}])
    # One block over all four columns = equal weights of the two cosines: p0, p3 tie at the top.
    assert set(ev.ndcg) == {"q1"} and 0 < ev.ndcg["q1"] <= 1
    assert ev.entity_p == {"q1": pytest.approx(0.2)}
    assert len(ev.intent_pred) == 4 and ev.intent_true == [0, 1, 0, 1]
    assert 0 <= ev.agreement <= 1 and math.isnan(ev.tau) and math.isnan(ev.agreement_intent_only)
    assert len(ev.sweep) == 1 and ev.sweep[0]["ndcg"] == ev.ndcg
    assert 1 <= ev.erank["all"] <= 4


def test_a_sparse_block_at_weight_zero_ranks_as_the_engine() -> None:
    """The exact dense + sparse sum agrees with the engine when the sparse weight is 0, and a
    sparse block alone ranks by its own scores (ties to the lower row)."""
    from esp_retrieval.training.evaluate.retrieval import score_dl_sweep

    rng = np.random.default_rng(0)
    layout = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
    n = 300
    corpus = normalize_blocks(rng.standard_normal((n, 12)).astype(np.float32), layout)
    qs = normalize_blocks(rng.standard_normal((3, 12)).astype(np.float32), layout)
    bench = DLBench(pids=[f"p{i}" for i in range(n)], texts=["x"] * n,
                    queries={"dl19": {f"q{i}": "x" for i in range(3)}},
                    qrels={"dl19": {f"q{i}": {f"p{j}": 1 for j in range(0, n, 7)} for i in range(3)}},
                    entities={}, pool={})
    queries = {f"q{i}": qs[i] for i in range(3)}
    sweep = simplex_grid(["semantic", "entity"], 0.25)
    plain = score_dl_sweep(bench, corpus, queries, layout, sweep=sweep, year="dl19")
    scores = rng.random((3, n))
    with_zero = score_dl_sweep(bench, corpus, queries, layout, sweep=[{**w, "bm25": 0.0} for w in sweep],
                               year="dl19", sparse={"bm25": scores})
    assert [p.per_query_ndcg for p in plain] == [p.per_query_ndcg for p in with_zero]
    alone = score_dl_sweep(bench, corpus, queries, layout, sweep=[{"semantic": 0, "entity": 0, "bm25": 1.0}],
                           year="dl19", sparse={"bm25": scores})[0]
    tied = np.zeros((3, n))  # all tied: the top 10 are rows 0..9
    first = score_dl_sweep(bench, corpus, queries, layout, sweep=[{"semantic": 0, "entity": 0, "bm25": 1.0}],
                           year="dl19", sparse={"bm25": tied})[0]
    from esp_retrieval.subspace.metrics import ndcg_at_k

    for i in range(3):
        top = np.argsort(-scores[i], kind="stable")[:10]
        assert alone.per_query_ndcg[f"q{i}"] == pytest.approx(
            ndcg_at_k([f"p{j}" for j in top], bench.qrels["dl19"][f"q{i}"], 10))
        assert first.per_query_ndcg[f"q{i}"] == pytest.approx(
            ndcg_at_k([f"p{j}" for j in range(10)], bench.qrels["dl19"][f"q{i}"], 10))
    with pytest.raises(ValueError, match="allowed"):
        score_dl_sweep(bench, corpus, queries, layout, sweep=[{"bogus": 1.0}], year="dl19", sparse={"bm25": scores})
