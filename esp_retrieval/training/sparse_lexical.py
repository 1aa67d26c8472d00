"""Build the sparse BM25 block of a corpus with ``bm25s`` (:mod:`subspace.sparse` holds the block).

``bm25s`` (Lu 2024) precomputes every (term, document) BM25 weight into a term-major sparse
matrix; that matrix, transposed to ``(N, V)`` CSR, *is* the block's document side, so the block
scores exactly what the library scores (a test checks it against ``bm25s.BM25.get_scores``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.sparse import SparseLexical
from esp_retrieval.training.config import SparseBlockSpec

if TYPE_CHECKING:
    from esp_retrieval.training.data.objectives import DataContext

#: BM25 parameters of the block (and of the evaluation's hybrid anchor): Anserini's MS MARCO
#: passage defaults, Lucene's variant, English stop words, no stemming
DEFAULTS = {"k1": 0.9, "b": 0.4, "stopwords": "en", "method": "lucene"}


def lucene_idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """Lucene's idf, ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (what ``bm25s`` folds into the weights)."""
    return np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)


def build_bm25(texts: Sequence[str], *, k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en",
               show_progress: bool = False) -> SparseLexical:
    """The ``(N, V)`` BM25 block of ``texts`` (Lucene variant, ``bm25s`` tokens)."""
    import bm25s

    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(bm25s.tokenize(list(texts), stopwords=stopwords, show_progress=show_progress),
                    show_progress=show_progress)
    sc = retriever.scores
    n_docs, n_cols = int(sc["num_docs"]), len(sc["indptr"]) - 1
    # bm25s numbers the tokens in order of appearance and appends "" (the token of an empty
    # document) last, without a column: the columns are the first n_cols tokens
    vocab = sorted(retriever.vocab_dict, key=retriever.vocab_dict.__getitem__)[:n_cols]
    if "" in vocab:
        raise ValueError("bm25s gave the empty token a column: an unexpected bm25s version")
    term_major = sp.csc_matrix((sc["data"], sc["indices"], sc["indptr"]), shape=(n_docs, n_cols))
    docs = sp.csr_matrix(term_major.tocsr().astype(np.float32))
    docs.sort_indices()
    df = np.diff(np.asarray(sc["indptr"]))
    return SparseLexical(docs, tuple(vocab), lucene_idf(df, n_docs),
                         {"k1": k1, "b": b, "stopwords": stopwords, "method": "lucene"})


def build_block(spec: SparseBlockSpec, pids: Sequence[str], texts: Sequence[str],
                data: DataContext | None = None) -> SparseLexical:
    """The sparse block ``spec`` names over the corpus ``pids``/``texts``: BM25, and with
    ``spec.term_weights`` its learned term weights, fitted on ``data``'s training queries only
    (:mod:`esp_retrieval.training.term_weights`)."""
    block = build_bm25(texts, k1=spec.k1, b=spec.b, stopwords=spec.stopwords)
    if spec.term_weights is None:
        return block
    if data is None:
        raise ValueError("sparse.term_weights: learned term weights need the run's training data")
    from esp_retrieval.training.term_weights import TermTrainingData, learn_term_weights

    training = TermTrainingData.from_context(data)
    return learn_term_weights(block, pids, texts, training, spec.term_weights).block
