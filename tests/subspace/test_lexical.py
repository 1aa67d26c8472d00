"""Hashed n-gram features: deterministic, bigram-aware, validated."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from esp_retrieval.subspace.lexical import HashedNgrams, idf, texts_digest

PASSAGES = [
    "Robert Gray was an American sea captain who explored the Columbia River.",
    "Kenneth Gray played football; Gray was his family name.",
    "The river flows into the Pacific Ocean near Astoria.",
]


def _cos(q: np.ndarray, d: np.ndarray, w: np.ndarray) -> np.ndarray:
    q, d = q * w, d * w
    return (d @ q.T).ravel() / (np.linalg.norm(d, axis=1) * np.linalg.norm(q) + 1e-12)


def test_counts_are_deterministic_and_sublinear() -> None:
    f = HashedNgrams(n_features=256)
    a, b = f.counts(PASSAGES), f.counts(PASSAGES)
    assert a.shape == (3, 256) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    # "gray" twice in passage 1: log1p(2) somewhere, never the raw count 2
    assert np.isclose(np.abs(a[1]), np.log1p(2.0), atol=1e-6).any()
    assert not np.isclose(np.abs(a[1]), 2.0).any()
    assert f.counts([]).shape == (0, 256)


def test_the_bigram_ranks_the_full_name_first() -> None:
    f = HashedNgrams(n_features=4096, ngram_max=2)
    docs = f.counts(PASSAGES)
    weights = idf(docs)
    scores = _cos(f.counts(["who is robert gray"]), docs, weights)
    assert int(np.argmax(scores)) == 0
    assert scores[0] > scores[1] > scores[2]
    # unigrams only: the surname still matches passage 1 but the name no longer outranks it as much
    uni = HashedNgrams(n_features=4096, ngram_max=1)
    d1 = uni.counts(PASSAGES)
    s1 = _cos(uni.counts(["who is robert gray"]), d1, idf(d1))
    assert scores[0] - scores[1] > s1[0] - s1[1]


def test_idf_is_higher_for_rarer_buckets() -> None:
    counts = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0]], dtype=np.float32)
    w = idf(counts)
    assert w[2] > w[1] > w[0] >= 1.0


def test_spec_round_trips_and_rejects_bad_values() -> None:
    f = HashedNgrams(n_features=512, ngram_max=3, stop_words=None)
    assert HashedNgrams.from_dict(f.to_dict()) == f
    with pytest.raises(ValueError, match="n_features"):
        HashedNgrams(n_features=2)
    with pytest.raises(ValueError, match="ngram_max"):
        HashedNgrams(ngram_max=5)
    with pytest.raises(ValueError, match="stop_words"):
        HashedNgrams(stop_words="french")
    with pytest.raises(ValueError, match="kind"):
        HashedNgrams.from_dict({"kind": "bm25", "n_features": 8, "ngram_max": 1})


def test_texts_digest_is_sha256_of_length_prefixed_utf8_texts() -> None:
    expected = hashlib.sha256(
        (2).to_bytes(8, "little") + b"ab" + (3).to_bytes(8, "little") + "é!".encode()
    ).hexdigest()
    assert texts_digest(["ab", "é!"]) == expected
    assert texts_digest(["ab"]) != texts_digest(["a", "b"])
    assert texts_digest([]) == hashlib.sha256().hexdigest()


def test_counts_memo_returns_the_counts_of_the_same_texts() -> None:
    lex = HashedNgrams(n_features=64)
    texts = ["robert gray", "gray whale"]
    first = lex.counts_memo(texts)
    assert lex.counts_memo(list(texts)) is first
    np.testing.assert_array_equal(first, lex.counts(texts))
    assert not np.array_equal(lex.counts_memo(["robert", "gray whale"]), first)
