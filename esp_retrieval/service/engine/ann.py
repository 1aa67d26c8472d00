"""``ESP_BACKEND=ivf`` over a bundle: the arguments the ``ivf`` backend is started with.

The bundle's ``ann/`` index when it has one (written by ``esp index --ann``; its files are
checksummed by the manifest and again by the index's own ``ivf.json``), else one built from the
embeddings at load time (the build seconds and bytes are logged). ``ESP_ANN_MAX_TOUCHED`` is the
fraction of the corpus a query may scan; a query whose per-list bounds prove its top k earlier
stops there, exactly. Below :data:`~esp_retrieval.subspace.engine.ivf.EXACT_BELOW` rows the backend answers
with the exact scan (the index cannot win there), so a bundle without ``ann/`` gets no index
built. A bad index refuses the bundle
(:class:`~esp_retrieval.subspace.engine.ivf_index.IvfIndexError`, a ``BundleError`` naming the file), so the
service keeps serving the one it had.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from esp_retrieval.subspace.bundle import Bundle
from esp_retrieval.subspace.engine.ivf import EXACT_BELOW
from esp_retrieval.subspace.engine.ivf_index import build_index, bundle_index_dir, load_index

log = logging.getLogger(__name__)


def ivf_options(bundle: Bundle, max_touched: float) -> dict[str, Any]:
    """``IvfBackend`` keyword arguments for ``bundle``: its index and the scan budget."""
    folder = bundle_index_dir(bundle.path)
    n = len(bundle.embeddings)
    if folder is None and n < EXACT_BELOW:
        log.info("ivf: %d rows < %d: no index built, the exact scan answers every query", n, EXACT_BELOW)
        return {"max_touched": max_touched}
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
    return {"index": index, "max_touched": max_touched}
