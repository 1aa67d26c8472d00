"""The engine's index kinds: ``exact`` (the backend registry's exhaustive scan) or ``ivf``.

``ESP_INDEX=ivf`` serves :class:`subspace.engine.ivf.IvfBackend`: the bundle's ``ann/`` index
when it has one (written by ``esp index --ann``; its files are checksummed by the manifest and
again by the index's own ``ivf.json``), else one built from the embeddings at load time (the
build seconds and bytes are logged). ``ESP_ANN_MAX_TOUCHED`` is the fraction of the corpus a
query may scan; a query whose per-list bounds prove its top k earlier stops there, exactly.
A bad index refuses the bundle (:class:`~subspace.engine.ivf_index.IvfIndexError`, a
``BundleError`` naming the file), so the service keeps serving the one it had.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from service.engine import Backend, EngineInputError, create_engine
from subspace.bundle import Bundle
from subspace.engine.ivf import IvfBackend
from subspace.engine.ivf_index import build_index, bundle_index_dir, load_index

log = logging.getLogger(__name__)


def _exact(bundle: Bundle, backend: str, precision: str, threads: int | None, max_touched: float) -> Backend:
    return create_engine(backend, bundle.embeddings, bundle.layout, precision=precision, threads=threads)


def _ivf(bundle: Bundle, backend: str, precision: str, threads: int | None, max_touched: float) -> Backend:
    folder = bundle_index_dir(bundle.path)
    t0 = time.perf_counter()
    if folder is not None:
        index = load_index(folder, bundle.embeddings, bundle.layout)
        how = f"read from {folder.name}/"
    else:
        index = build_index(bundle.embeddings, bundle.layout)
        how = "built at load (the bundle has no ann/; `esp index --ann` writes one)"
    log.info(
        "ivf index %s in %.2fs: %d partition(s) of %d lists, %s lists, %.0f MiB; max_touched %.3f",
        how,
        time.perf_counter() - t0,
        len(index.partitions),
        index.partitions[0].nlist,
        index.list_dtype,
        index.nbytes / 2**20,
        max_touched,
    )
    return IvfBackend(bundle.embeddings, bundle.layout, index=index, max_touched=max_touched, threads=threads)


# registry: index kind -> engine factory (bundle, backend, precision, threads, max_touched)
INDEXES: dict[str, Callable[[Bundle, str, str, int | None, float], Backend]] = {
    "exact": _exact,
    "ivf": _ivf,
}


def create_index_engine(
    kind: str,
    bundle: Bundle,
    *,
    backend: str = "auto",
    precision: str = "float32",
    threads: int | None = None,
    max_touched: float = 0.05,
) -> Backend:
    """The engine for index ``kind`` over ``bundle`` (``exact`` passes the backend settings on)."""
    if kind not in INDEXES:
        raise EngineInputError(f"unknown index {kind!r}; allowed: {list(INDEXES)}", "index")
    return INDEXES[kind](bundle, backend, precision, threads, max_touched)
