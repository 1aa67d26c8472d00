"""Exhaustive weighted kNN engine: one interface, a registry of backends, a logged fallback chain.

``create_engine("auto", corpus, layout)`` tries the backends fastest-first and logs why each one
that could not start was skipped (e.g. ``cupy: CUDA not available``). Every backend returns the
exact float64 top k (see :mod:`esp_retrieval.subspace.engine.base`); they differ only in speed and memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from esp_retrieval.service.engine.cupy_backend import CupyBackend
from esp_retrieval.service.engine.faiss_backend import FaissBackend
from esp_retrieval.service.engine.milvus_backend import MilvusBackend
from esp_retrieval.service.engine.torch_backend import TorchBackend
from esp_retrieval.subspace.engine.base import (
    PRECISIONS,
    Backend,
    BackendUnavailable,
    Capabilities,
    EngineInputError,
    LiveDocument,
    SearchResult,
    SparseUnsupportedError,
    check_precision,
)
from esp_retrieval.subspace.engine.ivf import IvfBackend
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from esp_retrieval.subspace.engine.pq_screen import PqScreenBackend
from esp_retrieval.subspace.engine.sparse_terms import SparseQuery
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.sparse import SparseLexical

log = logging.getLogger(__name__)

# registry: one line per backend (each module imports its library only when constructed)
BACKENDS: dict[str, type[Backend]] = {
    NumpyBackend.name: NumpyBackend,
    TorchBackend.name: TorchBackend,
    FaissBackend.name: FaissBackend,
    CupyBackend.name: CupyBackend,
    MilvusBackend.name: MilvusBackend,  # a Milvus collection (ESP_MILVUS_URI); not in auto
    IvfBackend.name: IvfBackend,  # approximate index (service.engine.ann: the bundle's); not in auto
    PqScreenBackend.name: PqScreenBackend,  # approximate: a quantised screen built at load; not in auto
}

# "auto": fastest first, per storage precision, as bench/knn.py ranks them on CPUs without a GPU
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "float32": ("cupy", "numpy", "torch", "faiss"),
    "float16": ("cupy", "torch", "faiss", "numpy"),
    "bfloat16": ("cupy", "torch", "faiss"),
}


def create_engine(
    name: str,
    corpus: np.ndarray,
    layout: SubspaceLayout,
    *,
    precision: str = "float32",
    threads: int | None = None,
    fallback: Sequence[str] | None = None,
    chunk_rows: int | None = None,
    options: Mapping[str, Callable[[], Mapping[str, Any]]] | None = None,
    sparse_blocks: Mapping[str, SparseLexical] | None = None,
) -> Backend:
    """Start backend ``name`` (or the first of :data:`AUTO_ORDER` that works, for ``"auto"``).

    If it cannot start here, each name in ``fallback`` is tried in turn; every skip is logged
    with its reason. Raises :class:`BackendUnavailable` listing all reasons when none starts,
    and :class:`EngineInputError` for an unknown backend or precision name. ``options``: per
    backend name, what returns its own keyword arguments, called only when that backend is
    tried (the ``ivf`` backend's index, :func:`esp_retrieval.service.engine.ann.ivf_options`).
    ``sparse_blocks``: the bundle's sparse blocks, given to every backend tried; one whose
    capabilities do not declare ``sparse`` is skipped with that reason.
    """
    check_precision(precision)
    chain = list(AUTO_ORDER[precision]) if name == "auto" else [name, *(fallback or ())]
    for candidate in chain:
        if candidate not in BACKENDS:
            raise EngineInputError(
                f"unknown engine backend {candidate!r}; allowed: {['auto', *BACKENDS]}", "backend"
            )
    reasons: list[str] = []
    for candidate in chain:
        try:
            extra = options[candidate]() if options and candidate in options else {}
            engine = BACKENDS[candidate](
                corpus,
                layout,
                precision=precision,
                threads=threads,
                chunk_rows=chunk_rows,
                **({"sparse_blocks": sparse_blocks} if sparse_blocks else {}),
                **extra,
            )
        except (BackendUnavailable, ImportError) as exc:
            reason = str(exc) if str(exc).startswith(f"{candidate}:") else f"{candidate}: {exc}"
            log.warning("engine backend skipped: %s", reason)
            reasons.append(reason)
            continue
        log.info(
            "engine backend %s started (precision %s, %d threads, %d docs)",
            candidate,
            precision,
            engine.threads,
            engine.num_docs,
        )
        return engine
    raise BackendUnavailable("no engine backend could start: " + "; ".join(reasons))


__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "PRECISIONS",
    "Backend",
    "BackendUnavailable",
    "Capabilities",
    "EngineInputError",
    "LiveDocument",
    "SearchResult",
    "SparseQuery",
    "SparseUnsupportedError",
    "create_engine",
]
