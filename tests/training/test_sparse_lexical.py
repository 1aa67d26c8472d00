"""The sparse BM25 block (esp_retrieval.subspace.sparse, built by esp_retrieval.training.sparse_lexical) is bm25s' BM25, exactly, as a dot product."""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import pytest

from esp_retrieval.subspace.sparse import SparseLexical, tokenize
from esp_retrieval.training.sparse_lexical import build_bm25

DOCS = ["The cat sat on the mat.", "A dog chased the cat; the cat ran.", "Dogs and cats, and dogs!",
        "Stock market news: stocks fell", "", "café au lait — naïve résumé"]
QUERIES = ["cat", "the dogs", "stock markets", "what is the", "résumé café", "cat cat mat"]


@pytest.fixture(scope="module")
def block() -> SparseLexical:
    return build_bm25(DOCS, k1=0.9, b=0.4, stopwords="en")


def test_tokens_are_bm25s_tokens() -> None:
    for text in DOCS + QUERIES:
        assert tokenize(text) == bm25s.tokenize([text], stopwords=None, return_ids=False,
                                                show_progress=False)[0]


def test_block_scores_are_bm25s_scores_over_the_attainable_maximum(block: SparseLexical) -> None:
    ref = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    ref.index(bm25s.tokenize(DOCS, stopwords="en", show_progress=False), show_progress=False)
    got = block.scores(block.encode(QUERIES))
    col = {t: i for i, t in enumerate(block.vocab)}
    for i, q in enumerate(QUERIES):
        toks = [t for t in bm25s.tokenize([q], stopwords="en", return_ids=False, show_progress=False)[0]
                if t in ref.vocab_dict]
        expect = ref.get_scores(toks) if toks else np.zeros(len(DOCS))
        top = sum(float(block.idf[col[t]]) for t in toks)
        np.testing.assert_allclose(got[i], expect / top if top else expect, rtol=1e-5, atol=1e-7)
    assert (got >= 0).all() and (got < 1).all()  # a cosine-like share: [0, 1)
    assert not got[3].any()  # only stop words: matches nothing


def test_scores_at_rows_equal_the_full_scores(block: SparseLexical) -> None:
    q = block.encode(QUERIES)
    full = block.scores(q)
    rows = np.array([[0, 2, -1], [5, 1, 0], [3, -1, -1], [0, 1, 2], [5, 4, 3], [0, 0, 1]])
    got = block.scores_at(q, rows)
    want = np.where(rows >= 0, np.take_along_axis(full, np.maximum(rows, 0), axis=1), 0.0)
    np.testing.assert_array_equal(got, want)  # bit for bit


def test_save_and_load_round_trip(block: SparseLexical, tmp_path: Path) -> None:
    files = block.save(tmp_path / "bm25")
    assert sorted(p.name for p in files) == ["data.npy", "indices.npy", "indptr.npy", "vocab.json"]
    back = SparseLexical.load(tmp_path / "bm25")
    assert back.vocab == block.vocab and back.params == block.params
    np.testing.assert_array_equal(back.idf, block.idf)
    q = block.encode(QUERIES)
    np.testing.assert_array_equal(back.scores(back.encode(QUERIES)), block.scores(q))


def test_mismatched_parts_are_refused(block: SparseLexical) -> None:
    with pytest.raises(ValueError, match="disagree"):
        SparseLexical(block.docs, block.vocab[:-1], block.idf[:-1])
