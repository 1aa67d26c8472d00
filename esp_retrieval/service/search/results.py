"""The search wing's request and result shapes: request vectors checked against the layout
(:func:`query_vector`), the queries for the micro-batcher (:func:`prepare_queries`), and the
``results`` of a response (:func:`build_results`), measured as they are built so an oversized
answer stops early (``ESP_MAX_RESPONSE_BYTES``).

Before the engine runs, :func:`check_answer_size` refuses a request whose *smallest* possible
answer is already past the limit: the hits it is sure to get (``k`` per query, fewer only where
the corpus is shorter than ``offset + k``; none assured with a filter, a ``score_threshold`` or
a backend that is approximate or holds its own documents) times the fewest bytes any hit of the
served corpus adds to :func:`build_results`' measure (its shortest id, its shortest display
fields). It never refuses what the measure while building would let through; that measure
stays, for everything it cannot rule out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from esp_retrieval.service.schemas import Query
from esp_retrieval.service.search.batching import QueryHits, QueryInput
from esp_retrieval.service.search.page import DISPLAY_FIELDS, SearchPage, display_bytes
from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout


def _layout_desc(layout: SubspaceLayout) -> str:
    return ", ".join(f"{n}:{d}" for n, d in zip(layout.names, layout.dims, strict=True))


def query_vector(
    vector: list[float] | dict[str, list[float]], layout: SubspaceLayout, field: str
) -> np.ndarray:
    """A request vector (full or per subspace) -> ``(D,)`` float64 as sent, checked against the
    layout and not all zero; the micro-batch normalises each block (``subspace.scoring.normalize_blocks``)."""
    if isinstance(vector, dict):
        out = np.zeros(layout.dim, dtype=np.float64)
        for name, block in vector.items():
            if name not in layout:
                raise FieldError(
                    f"{field} has unknown subspace {name!r}; valid names: {list(layout.names)}",
                    f"{field}.{name}",
                )
            if len(block) != layout[name].dim:
                raise FieldError(
                    f"{field}.{name} has {len(block)} components; subspace {name!r} has dim "
                    f"{layout[name].dim}",
                    f"{field}.{name}",
                )
            out[layout.slice(name)] = block
    else:
        if len(vector) != layout.dim:
            raise FieldError(
                f"{field} has {len(vector)} components; the layout has D={layout.dim} "
                f"({_layout_desc(layout)}), or send an object by subspace name",
                field,
            )
        out = np.asarray(vector, dtype=np.float64)
    # A finite non-zero block normalises to a non-zero block: checking the raw values suffices.
    if not out.any():
        raise FieldError(f"{field} is all zero: at least one subspace block must be non-zero", field)
    return out


def prepare_queries(queries: list[Query], state: ServingState) -> list[QueryInput]:
    out = []
    for i, q in enumerate(queries):
        field = f"queries[{i}]"
        if q.text is not None:
            if state.encoder is None:
                raise FieldError(
                    f"bundle {state.version} has no query encoder: send vectors instead of text",
                    f"{field}.text",
                )
            out.append(QueryInput(text=q.text))
        else:
            assert q.vector is not None  # the schema guarantees exactly one
            out.append(QueryInput(vector=query_vector(q.vector, state.layout, f"{field}.vector")))
    return out


_HIT_OVERHEAD = 48  # bytes of a hit's JSON besides its id, display fields and subspace scores
_SUBSPACE_BYTES = 32  # one "name": score pair, about


def too_large(size: int, limit: int, measured: str = "so far") -> FieldError:
    return FieldError(
        f"the response would be larger than {limit} bytes (setting ESP_MAX_RESPONSE_BYTES; about {size} "
        f"{measured}): ask for a smaller k or fewer queries",
        "k",
    )


def check_answer_size(
    state: ServingState, n_queries: int, page: SearchPage, max_bytes: int, *, filtered: bool
) -> None:
    """Refuse (:func:`too_large`) before the engine runs a request whose smallest possible answer
    is past ``max_bytes`` (module doc); ``filtered``: the request has a filter."""
    caps = state.engine.capabilities
    if filtered or page.score_threshold is not None or caps.approximate or caps.metadata:
        return  # any number of hits, down to none, may come back
    hits = max(0, min(page.engine_k, state.num_docs) - page.offset)
    shortest_id, display = state.answer_floors
    per_hit = _HIT_OVERHEAD + _SUBSPACE_BYTES * len(state.layout.names) + shortest_id
    if page.fields is not None:
        per_hit += sum(len(name) + 8 for name, _ in page.fields)  # each value: at least ""
    else:
        per_hit += display
    least = n_queries * hits * per_hit
    if least > max_bytes:
        raise too_large(least, max_bytes, f"at least: {n_queries} queries x {hits} hits x {per_hit} bytes")


def build_results(
    state: ServingState, hits: list[QueryHits], max_bytes: int | None = None, page: SearchPage | None = None
) -> list[dict[str, Any]]:
    """The ``results`` of a response. With ``max_bytes``, the body's size is estimated as it is
    built and a :class:`FieldError` raised as soon as it exceeds the limit. ``page``: which of
    each query's ranked hits are returned and what fields they carry (:mod:`service.search.page`)."""
    names = state.layout.names
    ids, docs = state.bundle.ids, state.docs
    per_hit = _HIT_OVERHEAD + _SUBSPACE_BYTES * len(names)
    size = 0
    results = []
    for h in hits:
        out = []
        rows, scores, subs = h.rows.tolist(), h.scores.tolist(), h.subspace_scores.tolist()
        cols = names if h.columns is None else h.columns  # with sparse blocks: theirs after the dense
        if page is not None:
            shown = page.cut(rows, scores)
            rows, scores, subs = rows[shown], scores[shown], subs[shown]
        # a backend that stores documents itself (milvus) names its hits; rows -1 pad short lists
        found = [r for r in rows if r >= 0]
        live = state.engine.documents(found) if state.engine.capabilities.metadata and found else None
        for j, (row, score, sub) in enumerate(zip(rows, scores, subs, strict=True)):
            if row < 0:
                break
            hit: dict[str, Any] = {
                "id": ids[row] if live is None else live[j][0],
                "score": score,
                "subspace_scores": dict(zip(cols, sub, strict=True)),
            }
            size += per_hit + len(hit["id"])
            doc = live[j][1] if live is not None else docs[row] if docs is not None else None
            if page is not None and page.fields is not None:
                hit["fields"] = selected = page.hit_fields(doc)
                size += sum(len(name) + len(str(value)) + 8 for name, value in selected.items())
            elif doc is not None:
                for key in DISPLAY_FIELDS:
                    value = doc.get(key)
                    if isinstance(value, str):
                        hit[key] = value
                size += display_bytes(doc)
            if max_bytes is not None and size > max_bytes:
                raise too_large(size, max_bytes)
            out.append(hit)
        results.append({"hits": out})
    return results
