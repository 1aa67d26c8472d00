"""A search's sparse blocks: their weights and query side (docs/architecture.md sections 1 and 3).

A bundle's sparse blocks (``sparse/<name>/``, :class:`subspace.sparse.SparseLexical`: BM25 as a dot
product) are weighed like its dense blocks: a request's weights are resolved against the bundle's
*weight layout* (:attr:`subspace.bundle.Bundle.weight_layout`: the dense blocks, then one entry per
sparse block, e.g. ``bm25``), so unknown names, operating points and experiment arms are checked
against one list of names. :func:`split` cuts the resolved ``(K + S,)`` weights into the dense
``(K,)`` and sparse ``(S,)`` parts; :func:`check` refuses (422) what cannot be scored exactly:
a sparse weight above 0 on a query sent as a vector (it has no text to encode), or on a backend
whose capabilities lack ``sparse`` (faiss, cupy, ivf, milvus), which serves the bundle without
its sparse blocks: there a sparse weight of 0 is the dense search (the engine contract), as before.

In the micro-batch, :func:`engine_sparse` encodes each text row with :meth:`SparseLexical.encode`
(a vector row, weighted 0 there, gets an empty row) and gives the engine one
:class:`~esp_retrieval.subspace.engine.sparse_terms.SparseQuery` per block with that block's weight per query
row, only when some row weighs a block: a batch that weighs none is the dense search.
:func:`columns` says which score columns a query's hits report (``subspace_scores``): the dense
blocks', and the sparse blocks' when its request weighs one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.engine.sparse_terms import SparseQuery
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.sparse import SparseLexical


def split(block_weights: np.ndarray, layout: SubspaceLayout) -> tuple[np.ndarray, np.ndarray]:
    """``(K + S,)`` weights resolved against the weight layout -> dense ``(K,)``, sparse ``(S,)``."""
    k = len(layout)
    return block_weights[:k], block_weights[k:]


def _source(weights: Any, operating_point: str | None, experiment: str | None, default_point: str | None,
            name: str) -> tuple[str, str]:
    """(field, words) naming where a sparse block's weight came from, for an error message."""
    if experiment is not None:
        return "experiment", f"the operating point of experiment {experiment!r}'s arm"
    if operating_point is not None:
        return "operating_point", f"operating point {operating_point!r}"
    if isinstance(weights, Mapping) and name in weights:
        return f"weights.{name}", "the request's weights"
    if isinstance(weights, list):
        return "weights", "the request's weights"
    if default_point is not None:
        return "weights", f"the default operating point {default_point!r}"
    return "weights", "the layout's default weights"


def check(
    sparse_weights: np.ndarray,
    names: Sequence[str],
    *,
    vector_rows: Sequence[int],
    served: bool,
    backend: str,
    weights: Any = None,
    operating_point: str | None = None,
    experiment: str | None = None,
    default_point: str | None = None,
) -> None:
    """Refuse (:class:`FieldError`, 422) a request whose sparse weights cannot be scored exactly.

    ``sparse_weights``: ``(S,)`` in ``names`` order; ``vector_rows``: the request's queries sent
    as vectors; ``served``: whether the engine scores the sparse blocks (``backend`` names it).
    The other arguments are the request's source of weights (``default_point``: the registry's
    default operating point, when it gave them), named in the message and ``field``.
    """
    weighed = [(n, float(w)) for n, w in zip(names, sparse_weights.tolist(), strict=True) if w > 0]
    if not weighed:
        return
    name, w = weighed[0]
    field, source = _source(weights, operating_point, experiment, default_point, name)
    if not served:
        raise FieldError(
            f"sparse block {name!r} has weight {w:g} ({source}), but backend {backend!r} cannot score "
            f"sparse blocks (its capabilities lack sparse; numpy and torch have it): send {name!r}: 0 "
            "in weights for the dense ranking",
            field,
        )
    if vector_rows:
        raise FieldError(
            f"queries[{vector_rows[0]}] is a vector, but sparse block {name!r} has weight {w:g} ({source}) "
            f"and scores the query's text: send text, or {name!r}: 0 in weights",
            f"queries[{vector_rows[0]}].vector",
        )


def for_request(body: Any, resolved: Any, state: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A search request's ``(K,)`` dense weights and ``(S,)`` weights of the sparse blocks the
    engine scores (``None`` when it scores none), after :func:`check`. ``body``: the
    :class:`~esp_retrieval.service.schemas.SearchRequest`; ``resolved``: its weights resolved against
    ``state.weight_layout`` (:meth:`esp_retrieval.service.tuning.Registry.resolve`); ``state``: the served
    :class:`~esp_retrieval.service.state.ServingState`."""
    dense, sparse = split(resolved.block_weights, state.layout)
    names = state.weight_layout.names[len(state.layout):]
    default_point = resolved.operating_point if body.operating_point is None else None
    check(
        sparse, names,
        vector_rows=[i for i, q in enumerate(body.queries) if q.vector is not None],
        served=bool(state.sparse), backend=state.engine.name,
        weights=body.weights, operating_point=body.operating_point, experiment=body.experiment,
        default_point=default_point,
    )
    return dense, (sparse if state.sparse else None)


def dense_only(resolved: Any, layout: SubspaceLayout, field: str = "weights") -> Any:
    """``resolved`` (weights resolved against the weight layout) cut to the dense blocks, for a
    route that scores no sparse term (``/v1/cluster``, ``/v1/embeddings``): its sparse weights are
    ignored there, and its dense weights must not all be 0."""
    dense = resolved.block_weights[: len(layout)]
    if not (dense > 0).any():
        raise FieldError(
            f"{field}: the weights of {list(layout.names)} are all zero, and sparse blocks do not apply "
            "here: at least one of them must be > 0",
            field,
        )
    used = {n: w for n, w in resolved.weights_used.items() if n in layout}
    return resolved._replace(block_weights=dense, weights_used=used)


def columns(
    layout: SubspaceLayout, sparse_names: Sequence[str], sparse_weights: np.ndarray
) -> tuple[str, ...]:
    """The names of the score columns a query's hits report: the dense blocks, then the sparse
    blocks when the query weighs any of them (the engine then scored their column)."""
    return (*layout.names, *sparse_names) if (sparse_weights > 0).any() else layout.names


def engine_sparse(
    blocks: Mapping[str, SparseLexical], texts: Sequence[str | None], weights: np.ndarray
) -> dict[str, SparseQuery] | None:
    """The engine's ``sparse=`` argument for a batch: ``texts`` per row (``None``: a vector row),
    ``weights`` ``(nq, S)`` in ``blocks`` order, already scaled as the dense ones. ``None`` when
    no row weighs a block (the dense search; a weight of 0 is that search, the engine contract)."""
    if not blocks or not (weights > 0).any():
        return None
    rows = [i for i, t in enumerate(texts) if t is not None]
    given = [t for t in texts if t is not None]
    out = {}
    for s, (name, block) in enumerate(blocks.items()):
        encoded = sp.csr_matrix(block.encode(given))
        # the encoded rows at their batch rows, each row's terms in encode's order; vector rows empty
        lengths = np.zeros(len(texts), np.int64)
        lengths[rows] = np.diff(encoded.indptr)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        vectors = sp.csr_matrix((encoded.data, encoded.indices, indptr), shape=(len(texts), encoded.shape[1]))
        out[name] = SparseQuery(vectors, np.ascontiguousarray(weights[:, s]))
    return out
