"""Hashed word n-gram features: the lexical input of a ``lexical`` head (docs/architecture.md s. 5).

A text becomes a dense ``(F,)`` vector of signed, sublinear word 1..n-gram counts hashed into
``F`` buckets (the hashing trick, Weinberger et al. 2009: scikit-learn's ``HashingVectorizer``,
MurmurHash3, ``alternate_sign`` so that colliding features cancel in expectation). A lexical head
multiplies it by learned per-bucket weights (initialised to the corpus IDF) and L2-normalises
it, so the cosine of two such blocks is a TF-IDF match of the texts' words and word pairs:
"robert gray" matches passages with that bigram above those that share only "gray".

The same function featurises training texts, the indexed corpus and, in the service, queries
(through :class:`encoder.QueryEncoder`), so the three can never disagree. Torch-free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: the analyser spec fields a bundle's encoder config records (``esp_encoder.json`` ``lexical``)
KIND = "hashed_ngrams"


@dataclass(frozen=True)
class HashedNgrams:
    """Featuriser spec: ``n_features`` buckets, word n-grams ``1..ngram_max``, English stop words
    dropped when ``stop_words`` is ``"english"`` (scikit-learn's list), lower-cased."""

    n_features: int = 1024
    ngram_max: int = 2
    stop_words: str | None = "english"

    def __post_init__(self) -> None:
        if self.n_features < 8:
            raise ValueError(f"lexical n_features must be >= 8, got {self.n_features}")
        if not 1 <= self.ngram_max <= 3:
            raise ValueError(f"lexical ngram_max must be 1, 2 or 3, got {self.ngram_max}")
        if self.stop_words not in (None, "english"):
            raise ValueError(f"lexical stop_words {self.stop_words!r} is invalid; allowed: 'english', null")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, **asdict(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HashedNgrams:
        if d.get("kind", KIND) != KIND:
            raise ValueError(f"lexical kind {d.get('kind')!r} is not supported; allowed: {KIND!r}")
        return cls(int(d["n_features"]), int(d["ngram_max"]), d.get("stop_words"))

    def _vectorizer(self) -> Any:
        from sklearn.feature_extraction.text import HashingVectorizer

        return HashingVectorizer(
            n_features=self.n_features,
            ngram_range=(1, self.ngram_max),
            stop_words=self.stop_words,
            lowercase=True,
            alternate_sign=True,
            norm=None,
            dtype=np.float32,
        )

    def counts(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, F)`` float32: signed bucket sums of n-gram counts, sublinear (``sign * log1p|c|``)."""
        if not len(texts):
            return np.zeros((0, self.n_features), dtype=np.float32)
        x = self._vectorizer().transform(list(texts)).toarray()
        return (np.sign(x) * np.log1p(np.abs(x))).astype(np.float32)

    def counts_memo(self, texts: Sequence[str]) -> np.ndarray:
        """:meth:`counts`, remembered for the last few text lists (keyed by a digest of the texts):
        the runs of an ablation featurise the same corpus again and again. Do not modify the result."""
        key = (self, texts_digest(texts))
        if key not in _MEMO:
            while len(_MEMO) >= _MEMO_SIZE:
                _MEMO.pop(next(iter(_MEMO)))
            _MEMO[key] = self.counts(texts)
        return _MEMO[key]


def texts_digest(texts: Sequence[str]) -> str:
    """sha256 (hex) of a list of texts, each length-prefixed (``["ab"]`` and ``["a", "b"]`` differ):
    the key of :meth:`HashedNgrams.counts_memo`, of the trunk feature cache and of a run's data hashes."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


_MEMO_SIZE = 4  # the corpus, the other texts of a run, spares
_MEMO: dict[tuple[HashedNgrams, str], np.ndarray] = {}


def idf(counts: np.ndarray) -> np.ndarray:
    """Smoothed inverse document frequency per bucket, ``log((1 + N) / (1 + df)) + 1``, ``(F,)``."""
    n = counts.shape[0]
    df = np.count_nonzero(counts, axis=0)
    return (np.log((1.0 + n) / (1.0 + df)) + 1.0).astype(np.float32)
