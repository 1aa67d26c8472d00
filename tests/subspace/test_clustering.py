"""The clustering core on hand-built embeddings whose topic and intent groups we control.

The semantic block encodes the topic, the intent block the intent: semantic-heavy weights must
recover the topics, intent-heavy weights must split every topic by intent (checked by ARI).
"""

from __future__ import annotations

import numpy as np
import pytest

from esp_retrieval.subspace.clustering import (
    METHODS,
    ClusteringError,
    _condensed_distances,
    cluster_embeddings,
    cluster_scores,
    dedupe_keywords,
    knn_graph,
    make_method,
    normalize_keyword,
    scaled_vectors,
)
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores
from esp_retrieval.subspace.weights import WeightError

LAYOUT = SubspaceLayout.from_dims({"semantic": 24, "entity": 8, "intent": 8})
TOPICS, INTENTS, PER_GROUP = 5, 3, 6

SEMANTIC_HEAVY = {"semantic": 1.0, "entity": 0.0, "intent": 0.05}
INTENT_HEAVY = {"semantic": 0.5, "entity": 0.0, "intent": 0.5}
# Every way of running a method: exact (dense) and the bounded-memory kNN-graph path.
RUNS = [
    ("agglomerative", {}),
    ("agglomerative", {"dense_limit_mb": 0, "knn": 8}),
    ("hdbscan", {}),
    ("hdbscan", {"dense_limit_mb": 0, "knn": 8}),
]


def _orthonormal(rng: np.random.Generator, k: int, dim: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((dim, k)))
    return q.T  # (k, dim), rows orthonormal


@pytest.fixture(scope="module")
def keywords() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(emb (n, D), topic (n,), intent (n,))`` for TOPICS x INTENTS groups of PER_GROUP keywords."""
    rng = np.random.default_rng(7)
    topic = np.repeat(np.arange(TOPICS), INTENTS * PER_GROUP)
    intent = np.tile(np.repeat(np.arange(INTENTS), PER_GROUP), TOPICS)
    n = len(topic)
    sem = _orthonormal(rng, TOPICS, 24)[topic] + 0.12 * rng.standard_normal((n, 24))
    ent = rng.standard_normal((n, 8))  # unrelated to both groupings
    inten = _orthonormal(rng, INTENTS, 8)[intent] + 0.12 * rng.standard_normal((n, 8))
    emb = normalize_blocks(np.concatenate([sem, ent, inten], axis=1).astype(np.float32), LAYOUT)
    order = rng.permutation(n)  # groups must not be recoverable from row order
    return emb[order], topic[order], intent[order]


@pytest.mark.parametrize(("method", "params"), RUNS)
def test_semantic_heavy_keeps_topics_together(keywords, method, params) -> None:
    emb, topic, intent = keywords
    res = cluster_embeddings(emb, LAYOUT, SEMANTIC_HEAVY, method, **params)
    assert cluster_scores(res.labels, topic)["ari"] > 0.95
    assert cluster_scores(res.labels, topic * INTENTS + intent)["ari"] < 0.6


@pytest.mark.parametrize(("method", "params"), RUNS)
def test_intent_heavy_splits_topics_by_intent(keywords, method, params) -> None:
    emb, topic, intent = keywords
    res = cluster_embeddings(emb, LAYOUT, INTENT_HEAVY, method, **params)
    assert cluster_scores(res.labels, topic * INTENTS + intent)["ari"] > 0.95
    assert cluster_scores(res.labels, topic)["ari"] < 0.6


@pytest.mark.parametrize(("method", "params"), RUNS)
def test_result_accounts_for_every_item_once(keywords, method, params) -> None:
    emb, _, _ = keywords
    res = cluster_embeddings(emb, LAYOUT, INTENT_HEAVY, method, **params)
    n = len(emb)
    assert res.labels.shape == (n,) and res.similarity.shape == (n,)
    assert res.sizes.sum() + res.n_noise == n
    assert list(res.sizes) == sorted(res.sizes, reverse=True)  # ids by decreasing size
    assert set(np.unique(res.labels[res.labels >= 0])) == set(range(res.n_clusters))
    # each label is a member of its own cluster, with similarity 1 to itself
    assert np.array_equal(res.labels[res.label_index], np.arange(res.n_clusters))
    np.testing.assert_allclose(res.similarity[res.label_index], 1.0, atol=1e-5)
    assert np.isnan(res.similarity[res.labels < 0]).all()
    assert np.isfinite(res.similarity[res.labels >= 0]).all()


def test_label_is_the_most_central_member_and_similarity_is_the_weighted_score(keywords) -> None:
    emb, _, _ = keywords
    w = np.array([0.7, 0.1, 0.2])
    res = cluster_embeddings(emb, LAYOUT, w, "agglomerative", threshold=0.6)
    s = reference_scores(emb, emb, w, LAYOUT) / w.sum()
    for c in range(res.n_clusters):
        members = np.flatnonzero(res.labels == c)
        mean_sim = s[np.ix_(members, members)].mean(axis=1)
        assert mean_sim[members == res.label_index[c]][0] == pytest.approx(mean_sim.max(), abs=1e-5)
        np.testing.assert_allclose(res.similarity[members], s[members, res.label_index[c]], atol=1e-5)


def test_condensed_distances_are_one_minus_normalised_weighted_score() -> None:
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(0)
    emb = normalize_blocks(rng.standard_normal((1100, LAYOUT.dim)).astype(np.float32), LAYOUT)
    w = np.array([0.5, 2.0, 0.25])
    got = squareform(_condensed_distances(scaled_vectors(emb, LAYOUT, w), float(w.sum())))
    want = 1.0 - reference_scores(emb, emb, w, LAYOUT) / w.sum()
    np.fill_diagonal(want, 0.0)
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_knn_graph_holds_the_true_nearest_neighbours_symmetrically() -> None:
    rng = np.random.default_rng(1)
    emb = normalize_blocks(rng.standard_normal((300, LAYOUT.dim)).astype(np.float32), LAYOUT)
    w = np.array([1.0, 0.0, 3.0])
    g = knn_graph(scaled_vectors(emb, LAYOUT, w), float(w.sum()), k=5)
    assert (g != g.T).nnz == 0
    d = 1.0 - reference_scores(emb, emb, w, LAYOUT) / w.sum()
    np.fill_diagonal(d, np.inf)
    for i in range(0, 300, 37):
        nearest = set(np.argsort(d[i], kind="stable")[:5].tolist())
        assert nearest <= set(g[i].indices.tolist())
        np.testing.assert_allclose(g[i, sorted(nearest)].toarray()[0], d[i, sorted(nearest)], atol=1e-5)


def test_hdbscan_reports_outliers_as_noise(keywords) -> None:
    emb, _, _ = keywords
    rng = np.random.default_rng(3)
    outliers = normalize_blocks(rng.standard_normal((4, LAYOUT.dim)).astype(np.float32), LAYOUT)
    both = np.concatenate([emb, outliers])
    for params in ({}, {"dense_limit_mb": 0, "knn": 8}):
        res = cluster_embeddings(both, LAYOUT, INTENT_HEAVY, "hdbscan", **params)
        assert (res.labels[-4:] == -1).all(), params
        assert res.n_noise >= 4


def test_disconnected_knn_graph_still_clusters() -> None:
    # two far-apart groups, knn smaller than each group: the kNN graph has two components
    rng = np.random.default_rng(5)
    centres = _orthonormal(rng, 2, LAYOUT.dim)
    emb = normalize_blocks(
        (np.repeat(centres, 10, axis=0) + 0.05 * rng.standard_normal((20, LAYOUT.dim))).astype(np.float32),
        LAYOUT,
    )
    truth = np.repeat([0, 1], 10)
    for method in METHODS:
        res = cluster_embeddings(emb, LAYOUT, None, method, dense_limit_mb=0, knn=3)
        assert cluster_scores(res.labels, truth)["ari"] == pytest.approx(1.0), method


def test_single_and_tiny_inputs() -> None:
    emb = normalize_blocks(np.ones((1, LAYOUT.dim), np.float32), LAYOUT)
    res = cluster_embeddings(emb, LAYOUT, None, "agglomerative")
    assert res.labels.tolist() == [0] and res.label_index.tolist() == [0]
    res = cluster_embeddings(emb, LAYOUT, None, "hdbscan")
    assert res.labels.tolist() == [-1] and res.n_clusters == 0


def test_threshold_controls_granularity(keywords) -> None:
    emb, _, _ = keywords
    counts = [
        cluster_embeddings(emb, LAYOUT, INTENT_HEAVY, "agglomerative", threshold=t).n_clusters
        for t in (0.05, 0.4, 1.5)
    ]
    assert counts[0] > counts[1] > counts[2]
    assert counts[2] == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"method": "kmeans"}, "method"),
        ({"method": "hdbscan", "threshold": 0.3}, "threshold"),
        ({"method": "agglomerative", "min_cluster_size": 3}, "min_cluster_size"),
        ({"method": "agglomerative", "threshold": 2.5}, "threshold"),
        ({"method": "agglomerative", "threshold": True}, "threshold"),
        ({"method": "agglomerative", "linkage": "ward"}, "linkage"),
        ({"method": "hdbscan", "min_cluster_size": 1}, "min_cluster_size"),
        ({"method": "hdbscan", "knn": 1}, "knn"),
    ],
)
def test_bad_parameters_name_the_field(kwargs, field) -> None:
    params = dict(kwargs)
    with pytest.raises(ClusteringError) as err:
        make_method(params.pop("method"), **params)
    assert err.value.field == field
    assert field in str(err.value)


@pytest.mark.parametrize(("method", "params"), RUNS)
def test_the_clusters_do_not_depend_on_the_scale_of_the_weights(keywords, method, params) -> None:
    """``1 - s / W`` is scale-invariant, as search's ranking is: weights of 1e-300 (whose square
    roots underflow float32) cluster as their 1e300-fold multiple does, with finite similarities."""
    emb, _, _ = keywords
    base = cluster_embeddings(emb, LAYOUT, SEMANTIC_HEAVY, method, **params)
    for scale in (1e-300, 1e-30, 1e30):
        w = {name: v * scale for name, v in SEMANTIC_HEAVY.items()}
        res = cluster_embeddings(emb, LAYOUT, w, method, **params)
        np.testing.assert_array_equal(res.labels, base.labels)
        np.testing.assert_allclose(res.similarity, base.similarity, atol=1e-5)
        assert np.isfinite(res.similarity[res.labels >= 0]).all()
        np.testing.assert_array_equal(res.block_weights, [w[n] for n in LAYOUT.names])  # as asked


def test_bad_weights_and_inputs(keywords) -> None:
    emb, _, _ = keywords
    with pytest.raises(WeightError, match="valid names"):
        cluster_embeddings(emb, LAYOUT, {"topic": 1.0})
    with pytest.raises(WeightError, match="all zero"):
        cluster_embeddings(emb, LAYOUT, {"semantic": 0, "entity": 0, "intent": 0})
    with pytest.raises(ClusteringError, match="no keywords"):
        cluster_embeddings(emb[:0], LAYOUT, None)
    with pytest.raises(ClusteringError, match=r"\(n, 40\)"):
        cluster_embeddings(emb[:, :10], LAYOUT, None)


def test_dedupe_keeps_first_spelling_and_reports_positions() -> None:
    unique, merged = dedupe_keywords(["Rice Cooker", "buy rice", "rice  cooker ", "RICE COOKER", "Ｂuy rice"])
    assert unique == ["Rice Cooker", "buy rice"]
    assert merged == [(2, 0), (3, 0), (4, 1)]
    assert normalize_keyword("  Straße\tPrices ") == "strasse prices"
    with pytest.raises(ClusteringError) as err:
        dedupe_keywords(["ok", "  "])
    assert err.value.field == "keywords[1]"


def test_cluster_scores_definitions() -> None:
    labels = np.array([0, 0, 0, 1, 1, -1])
    truth = ["a", "a", "b", "b", "b", "a"]
    s = cluster_scores(labels, truth)
    assert s["purity"] == pytest.approx(4 / 5)  # noise left out
    assert s["noise"] == pytest.approx(1 / 6)
    assert s["n_clusters"] == 2
    perfect = cluster_scores(np.array([1, 1, 0]), ["x", "x", "y"])
    assert perfect["purity"] == perfect["nmi"] == perfect["ari"] == pytest.approx(1.0)


def test_graph_average_linkage_on_a_complete_graph_equals_exact_average_linkage() -> None:
    # with every pair an edge, the bounded-memory path must reproduce scipy's exact clusters
    rng = np.random.default_rng(11)
    emb = normalize_blocks(rng.standard_normal((80, LAYOUT.dim)).astype(np.float32), LAYOUT)
    w = {"semantic": 1.0, "entity": 0.3, "intent": 2.0}
    for t in (0.7, 0.85, 0.95):
        exact = cluster_embeddings(emb, LAYOUT, w, "agglomerative", threshold=t)
        graph = cluster_embeddings(emb, LAYOUT, w, "agglomerative", threshold=t, dense_limit_mb=0, knn=79)
        assert 1 < exact.n_clusters < 80, t  # a threshold that really merges something
        np.testing.assert_array_equal(graph.labels, exact.labels)
        np.testing.assert_array_equal(graph.label_index, exact.label_index)
