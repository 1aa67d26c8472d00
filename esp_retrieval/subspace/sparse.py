"""A sparse, vocabulary-sized lexical block: BM25 as an exact dot product (docs/architecture.md s. 1).

BM25 (Robertson and Zaragoza 2009; Lucene's variant, which drops the constant ``k1 + 1``) is

    bm25(q, d) = sum_{t in q} c_q(t) * idf(t) * tf(t, d) / (tf(t, d) + k1 (1 - b + b |d| / avgdl))

so a document is a ``(V,)`` vector of ``idf(t) * saturated tf`` (built once, by ``bm25s`` at
index time) and a query a ``(V,)`` vector of its term counts: one sparse dot product, exact,
no hash collisions. The query vector is divided by its largest attainable score
``sum_t c_q(t) idf(t)`` (each saturated tf is below 1), so the block's score lies in ``[0, 1)``
like a cosine and a serving weight means the same share here as in a dense block; the factor is
per query, so it changes no ranking of the block alone (what per-query min-max fusion of a
BM25 list buys, as a linear, exact score).

Tokens are those of ``bm25s.tokenize``: lower-cased, ``\\b\\w\\w+\\b``; the vocabulary holds the
corpus' tokens after stop-word removal, so a stop word (or any unseen word) in a query matches
nothing. Storage: ``(N, V)`` CSR float32 plus the vocabulary and idf, as ``.npy`` and JSON (no
pickle). Torch-free: the service, training and evaluation share this one class.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.atomic import atomic_write_bytes, atomic_write_text

#: the token pattern of ``bm25s.tokenize`` (and scikit-learn's CountVectorizer)
TOKEN = re.compile(r"(?u)\b\w\w+\b")
KIND = "bm25"
_FILES = ("data", "indices", "indptr")
#: the files :meth:`SparseLexical.save` writes into its folder
FILES = (*(f"{n}.npy" for n in _FILES), "vocab.json")


def tokenize(text: str) -> list[str]:
    """``bm25s.tokenize``'s tokens of ``text`` before stop-word removal."""
    return TOKEN.findall(text.lower())


@dataclass(frozen=True)
class SparseLexical:
    """The documents' BM25 term weights ``(N, V)`` and what encodes a query against them."""

    docs: sp.csr_matrix  # (N, V) float32: idf(t) * saturated tf(t, d)
    vocab: tuple[str, ...]  # column order
    idf: np.ndarray  # (V,) float32
    params: Mapping[str, Any] = field(default_factory=dict)  # k1, b, stopwords, method: provenance
    _column: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n_vocab = len(self.vocab)
        if self.docs.shape[1] != n_vocab or self.idf.shape != (n_vocab,):
            raise ValueError(f"sparse block: docs {self.docs.shape}, vocab {n_vocab} and idf "
                             f"{self.idf.shape} "
                             "disagree")
        object.__setattr__(self, "_column", {t: i for i, t in enumerate(self.vocab)})

    @property
    def n_docs(self) -> int:
        return int(self.docs.shape[0])

    def encode(self, texts: Sequence[str]) -> sp.csr_matrix:
        """``(n, V)`` float64 query vectors: term counts over the largest attainable score."""
        indptr, cols, vals = [0], [], []
        for text in texts:
            counts: dict[int, int] = {}
            for tok in tokenize(text):
                col = self._column.get(tok)
                if col is not None:
                    counts[col] = counts.get(col, 0) + 1
            c = np.fromiter(counts, dtype=np.int64, count=len(counts))
            v = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            top = float(v @ self.idf[c].astype(np.float64)) if len(c) else 0.0
            cols.append(c)
            vals.append(v / top if top > 0 else v)
            indptr.append(indptr[-1] + len(c))
        return sp.csr_matrix((np.concatenate(vals) if vals else np.zeros(0),
                              np.concatenate(cols) if cols else np.zeros(0, np.int64), np.asarray(indptr)),
                             shape=(len(texts), len(self.vocab)))

    def scores(self, queries: sp.csr_matrix) -> np.ndarray:
        """``(n, N)`` float64 block scores of encoded ``queries`` against every document."""
        return np.asarray((queries @ self.docs.T.astype(np.float64)).toarray())

    def scores_at(self, queries: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
        """``(n, M)`` float64 scores of query ``i`` against documents ``rows[i]`` (``-1``: 0), equal
        to :meth:`scores` bit for bit (the same products summed in the same order, the query's)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros(rows.shape, dtype=np.float64)
        for i in range(rows.shape[0]):
            ok = rows[i] >= 0
            if ok.any():
                d = self.docs[rows[i][ok]].T.astype(np.float64)
                out[i, ok] = np.asarray((queries[i] @ d).toarray()).ravel()
        return out

    # --- storage -------------------------------------------------------------------------------
    def save(self, folder: Path) -> list[Path]:
        """Write ``folder/{data,indices,indptr}.npy`` and ``folder/vocab.json`` (atomically each);
        returns the files written."""
        folder.mkdir(parents=True, exist_ok=True)
        csr = self.docs.tocsr()
        arrays = {"data": csr.data.astype(np.float32), "indices": csr.indices.astype(np.int32),
                  "indptr": csr.indptr.astype(np.int64)}
        out = []
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            out.append(atomic_write_bytes(folder / f"{name}.npy", buf.getvalue()))
        meta = {"kind": KIND, "n_docs": self.n_docs, "vocab": list(self.vocab),
                "idf": [float(x) for x in self.idf], "params": dict(self.params)}
        out.append(atomic_write_text(folder / "vocab.json", json.dumps(meta) + "\n"))
        return out

    @classmethod
    def load(cls, folder: Path) -> SparseLexical:
        """Inverse of :meth:`save`; the arrays are read into memory (no file stays mapped)."""
        return cls.from_bytes({name: (folder / name).read_bytes() for name in FILES})

    @classmethod
    def from_bytes(cls, files: Mapping[str, bytes]) -> SparseLexical:
        """The block from the contents of the files of :data:`FILES` (read once, e.g. hashed as
        read by :func:`subspace.bundle.read_bundle`); ``ValueError`` naming the file at fault."""
        try:
            meta = json.loads(files["vocab.json"].decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"vocab.json: not valid JSON ({exc})") from exc
        if not isinstance(meta, dict) or meta.get("kind") != KIND:
            kind = meta.get("kind") if isinstance(meta, dict) else None
            raise ValueError(f"vocab.json: kind must be {KIND!r}, got {kind!r}")
        parts = {}
        for n in _FILES:
            try:
                parts[n] = np.load(io.BytesIO(files[f"{n}.npy"]), allow_pickle=False)
            except (ValueError, OSError, EOFError) as exc:
                raise ValueError(f"{n}.npy: unreadable ({exc})") from exc
        try:
            docs = sp.csr_matrix((parts["data"], parts["indices"], parts["indptr"]),
                                 shape=(int(meta["n_docs"]), len(meta["vocab"])))
            docs.check_format(full_check=True)
            idf = np.asarray(meta["idf"], dtype=np.float32)
            return cls(docs, tuple(meta["vocab"]), idf, meta.get("params", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"data.npy, indices.npy, indptr.npy, vocab.json disagree ({exc})") from exc
