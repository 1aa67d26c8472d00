"""The approximate backends' common part: the exact scan answers where their index cannot win.

An index has a fixed cost per query (list summaries, a screen of every row's codes) that a small
corpus does not repay; there the approximate backends (``ivf``, ``pq``) hand every query to the
numpy backend's exact scan of the same corpus, decided once at load, logged, and shown as
``fallback`` (the reason). Rules and measurements: the ``ivf`` module's docstring.
"""

from __future__ import annotations

import logging

import numpy as np

from esp_retrieval.subspace.engine.base import Backend, EngineInputError
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend


class ExactFallback(Backend):
    """A backend that may answer through :class:`NumpyBackend` (``_exact``) instead of its index."""

    #: why the exact scan answers every query (``None``: the index does)
    fallback: str | None = None
    _exact: NumpyBackend | None = None

    @staticmethod
    def _checked_exact_below(value: object) -> int:
        """``exact_below`` as given, if it is an integer ``>= 0`` (``0``: the index always answers)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise EngineInputError(f"exact_below must be an integer >= 0, got {value!r}", "exact_below")
        return value

    def _start_exact(self, corpus: np.ndarray, reason: str) -> None:
        """Answer every query with the exact scan of ``corpus`` (no copy), for ``reason``."""
        self.fallback = reason
        precision = "float16" if corpus.dtype == np.float16 else "float32"
        blocks = None if self.sparse_blocks is None else self.sparse_blocks.blocks
        self._exact = NumpyBackend(
            corpus, self.layout, precision=precision, threads=self.threads, sparse_blocks=blocks
        )
        logging.getLogger(type(self).__module__).info(  # the backend's own logger, as before
            "%s: the exact scan answers every query (%s): the index cannot win here", self.name, reason
        )

    def set_threads(self, threads: int) -> None:
        super().set_threads(threads)
        if self._exact is not None:
            self._exact.set_threads(threads)

    def close(self) -> None:
        if self._exact is not None:
            self._exact.close()
