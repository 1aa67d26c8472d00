"""The real server (uvicorn subprocess) answers exactly what the engine and the encoder say."""

from __future__ import annotations

import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.client.client import ESPClient, ESPError
from esp_retrieval.service.engine import create_engine
from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores, topk


@pytest.fixture(scope="module")
def client(served: LiveServer):
    with ESPClient(served.url) as c:
        yield c


@pytest.fixture(scope="module")
def bundle(served: LiveServer):
    return read_bundle(served.bundle)


def _queries(bundle, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return normalize_blocks(rng.standard_normal((n, bundle.layout.dim)).astype(np.float32), bundle.layout)


def test_vector_queries_return_exactly_the_engines_ids_and_scores(client: ESPClient, bundle) -> None:
    layout = bundle.layout
    q = _queries(bundle, 5, seed=1)
    weights = {"semantic": 0.7, "entity": 0.2, "intent": 0.1}
    res = client.search(q, k=7, weights=weights)
    engine = create_engine("numpy", bundle.embeddings, layout, threads=1)
    w = np.array([weights[n] for n in layout.names])
    ref = engine.search(q, w, 7)
    assert res.bundle_version == bundle.version
    assert res.weights_used == pytest.approx(weights)
    for i, result in enumerate(res.results):
        assert [h.id for h in result.hits] == [bundle.ids[r] for r in ref.rows[i]]
        np.testing.assert_allclose([h.score for h in result.hits], ref.scores[i], rtol=1e-5, atol=1e-6)
        for j, hit in enumerate(result.hits):
            np.testing.assert_allclose(
                [hit.subspace_scores[n] for n in layout.names], ref.subspace_scores[i, j], atol=1e-5
            )
    # and the engine agrees with the float64 per-block reference
    exact = reference_scores(q, np.asarray(bundle.embeddings), w, layout)
    _, idx = topk(exact, 7)
    assert [[h.id for h in r.hits] for r in res.results] == [[bundle.ids[j] for j in row] for row in idx]


def test_hits_carry_display_text_and_weighted_score(client: ESPClient, bundle) -> None:
    docs = bundle.docs()
    res = client.search(_queries(bundle, 1, seed=2)[0], k=5, weights=[1.0, 0.5, 0.25])
    for hit in res.results[0].hits:
        row = bundle.ids.index(hit.id)
        assert hit.text == docs[row]["text"]
        expected = (
            1.0 * hit.subspace_scores["semantic"]
            + 0.5 * hit.subspace_scores["entity"]
            + 0.25 * (hit.subspace_scores["intent"])
        )
        assert hit.score == pytest.approx(expected, abs=1e-5)


def test_text_queries_match_encoding_then_scoring(client: ESPClient, bundle) -> None:
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    texts = ["what is the capital of france", "how to cook rice", "symptoms of flu in adults"]
    res = client.search(texts, k=5)
    enc = QueryEncoder.load(bundle.encoder_dir).encode(texts)
    w = bundle.layout.default_weights()
    exact = reference_scores(enc, np.asarray(bundle.embeddings), w, bundle.layout)
    vals, idx = topk(exact, 5)
    for i, result in enumerate(res.results):
        assert [h.id for h in result.hits] == [bundle.ids[j] for j in idx[i]]
        np.testing.assert_allclose([h.score for h in result.hits], vals[i], atol=1e-4)


def test_two_weight_vectors_reorder_as_the_subspace_scores_say(client: ESPClient, bundle) -> None:
    """A query whose semantic block is doc A's and whose entity block is doc B's: the semantic-heavy
    weights rank A first, the entity-heavy ones B, and every list is sorted by w . subspace_scores."""
    layout = bundle.layout
    emb = np.asarray(bundle.embeddings, dtype=np.float32)
    w_sem = {"semantic": 1.0, "entity": 0.1, "intent": 0.0}
    w_ent = {"semantic": 0.1, "entity": 1.0, "intent": 0.0}

    def mixed(a: int, b: int) -> np.ndarray:
        q = np.zeros(layout.dim, dtype=np.float32)
        q[layout.slice("semantic")] = emb[a, layout.slice("semantic")]
        q[layout.slice("entity")] = emb[b, layout.slice("entity")]
        return q

    def top1(q: np.ndarray, w: dict[str, float]) -> int:
        return int(
            np.argmax(reference_scores(q[None], emb, np.array([w[n] for n in layout.names]), layout)[0])
        )

    # The first pair whose own blocks win under each weighting (untrained embeddings may hold
    # near-duplicate passages, so this is checked, not assumed).
    a, b = next(
        (a, b)
        for a in range(10)
        for b in range(10, 30)
        if top1(mixed(a, b), w_sem) == a and top1(mixed(a, b), w_ent) == b
    )
    q = mixed(a, b)
    vector = {"semantic": q[layout.slice("semantic")].tolist(), "entity": q[layout.slice("entity")].tolist()}
    sem = client.search([vector], k=10, weights=w_sem).results[0].hits
    ent = client.search([vector], k=10, weights=w_ent).results[0].hits
    assert sem[0].id == bundle.ids[a]
    assert ent[0].id == bundle.ids[b]
    assert [h.id for h in sem] != [h.id for h in ent]
    for hits, w in ((sem, w_sem), (ent, w_ent)):
        recomputed = [sum(w[n] * h.subspace_scores[n] for n in layout.names) for h in hits]
        np.testing.assert_allclose([h.score for h in hits], recomputed, atol=1e-5)
        assert recomputed == sorted(recomputed, reverse=True)
    # Documents in both lists swap places exactly when their re-weighted scores say so.
    by_id = {h.id: h for h in sem}
    common = [h.id for h in ent if h.id in by_id]
    rescored = [sum(w_ent[n] * by_id[i].subspace_scores[n] for n in layout.names) for i in common]
    assert rescored == sorted(rescored, reverse=True)


def test_ranking_is_scale_invariant_even_for_tiny_weights(client: ESPClient, bundle) -> None:
    q = _queries(bundle, 1, seed=6)
    base = client.search(q, k=8, weights=[1.0, 0.5, 0.25]).results[0].hits
    tiny = client.search(q, k=8, weights=[1e-300, 5e-301, 2.5e-301]).results[0].hits
    big = client.search(q, k=8, weights=[1e6, 5e5, 2.5e5]).results[0].hits
    assert [h.id for h in tiny] == [h.id for h in base] == [h.id for h in big]
    np.testing.assert_allclose([h.score * 1e300 for h in tiny], [h.score for h in base], rtol=1e-5)
    np.testing.assert_allclose([h.score / 1e6 for h in big], [h.score for h in base], rtol=1e-5)


def test_per_subspace_vector_equals_the_full_vector(client: ESPClient, bundle) -> None:
    layout = bundle.layout
    q = _queries(bundle, 1, seed=3)[0]
    full = client.search([q], k=5).results[0].hits
    parts = client.search([{n: q[layout.slice(n)] for n in layout.names}], k=5).results[0].hits
    assert [h.id for h in full] == [h.id for h in parts]


def test_operating_point_and_experiment_sources(client: ESPClient, bundle) -> None:
    q = _queries(bundle, 1, seed=4)
    res = client.search(q, k=3, operating_point="entity_heavy_reg")
    assert res.operating_point == "entity_heavy_reg"
    assert res.weights_used == pytest.approx({"semantic": 0.05, "entity": 1.0, "intent": 0.05})
    res = client.search(q, k=3, experiment="ent", unit_id="user-42")
    assert res.experiment == "ent"
    assert res.arm in {"control", "treatment"}
    assignment = client.assignment("ent", "user-42")
    assert assignment["arm"] == res.arm
    assert res.weights_used == pytest.approx(assignment["weights"])
    with pytest.raises(ESPError) as err:
        client.search(q, k=3, operating_point="entity_heavy_reg", weights={"semantic": 1.0})
    assert err.value.status == 422


def test_layout_endpoint(client: ESPClient, bundle) -> None:
    lay = client.layout()
    assert [s.name for s in lay.subspaces] == list(bundle.layout.names)
    assert [s.dim for s in lay.subspaces] == list(bundle.layout.dims)
    assert lay.dim == bundle.layout.dim
    assert lay.bundle_version == bundle.version
    assert client.health().status == "ok"
    assert client.ready().bundle_version == bundle.version
