"""What one search returns of the exact ranking: ``offset``, ``score_threshold``, ``fields``.

Implemented once, for every backend: the engine is asked for the exact top ``offset + k``
(:attr:`SearchPage.engine_k`, so page ``p`` is hits ``p k .. (p + 1) k`` of one larger search),
and the hits are cut where they are built (:meth:`SearchPage.cut`): the first ``offset`` are
dropped, then every hit scoring below ``score_threshold`` (the ranking is by score, so that
keeps a prefix). ``fields`` names the document metadata fields each hit carries (an object
``fields`` on the hit, ``null`` where a document has no value), checked against the served
corpus' metadata schema (:func:`esp_retrieval.service.filtering.filter_context`: the bundle's, or a Milvus
collection's own) and written in the schema's type whatever the backend stores (a date as
:func:`esp_retrieval.subspace.filters.format_date` writes it), so every backend answers the same values.
Without ``fields`` a hit carries the display fields (``text``, ``title``, ``url``) as before.

Bounds: ``offset + k <= max_k`` and queries x ``(offset + k) <= max_hits`` (the engine's work),
each a :class:`~esp_retrieval.subspace.errors.FieldError` naming ``offset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from esp_retrieval.service.config import Settings
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.filters import FieldType, FilterError, MetadataSchema, coerce_value, format_date

#: Hit keys of the display fields shown when a request names no ``fields``.
DISPLAY_FIELDS = ("text", "title", "url")


def display_bytes(doc: Mapping[str, Any]) -> int:
    """What a hit's display fields add to the response's measure (:mod:`service.search.results`)."""
    return sum(len(v) + 12 for key in DISPLAY_FIELDS if isinstance(v := doc.get(key), str))


@dataclass(frozen=True, slots=True)
class SearchPage:
    """The part of the exact ranking a request asked for."""

    k: int
    offset: int = 0
    score_threshold: float | None = None
    #: ``(name, type)`` of each requested field, in request order; ``None``: the display fields
    fields: tuple[tuple[str, FieldType], ...] | None = None

    @property
    def engine_k(self) -> int:
        """How many hits the engine ranks per query: the page and everything above it."""
        return self.offset + self.k

    def cut(self, rows: list[int], scores: list[float]) -> slice:
        """Which of a query's ranked hits to return: ``rows`` (row ``-1`` pads a short list at
        its end) and ``scores`` (descending) as the engine ranked them."""
        end = min(self.engine_k, next((j for j, r in enumerate(rows) if r < 0), len(rows)))
        start = min(self.offset, end)
        if self.score_threshold is not None:
            t = self.score_threshold
            while end > start and not scores[end - 1] >= t:
                end -= 1
        return slice(start, end)

    def hit_fields(self, doc: Mapping[str, Any] | None) -> dict[str, Any]:
        """The requested fields of one document (``fields`` set), each in its schema type or ``None``."""
        assert self.fields is not None
        return {name: field_value(kind, None if doc is None else doc.get(name)) for name, kind in self.fields}


def field_value(kind: FieldType, value: Any) -> Any:
    """A document's value of a field of type ``kind`` as a hit returns it: ``None`` when it is
    missing or not of that type; a date as ``format_date`` writes it (UTC, ``Z``)."""
    if value is None:
        return None
    try:
        stored = coerce_value(kind, value, "fields")
    except FilterError:
        return None
    return format_date(stored) if kind == FieldType.DATE else stored


def search_page(
    settings: Settings,
    schema: MetadataSchema | None,
    *,
    n_queries: int,
    k: int,
    offset: int = 0,
    score_threshold: float | None = None,
    fields: list[str] | None = None,
) -> SearchPage:
    """Check a request's page against the limits and its ``fields`` against ``schema`` (the
    served corpus' metadata fields; needed only with ``fields``)."""
    if offset:
        if offset + k > settings.max_k:
            raise FieldError(
                f"offset + k must be at most {settings.max_k} (setting ESP_MAX_K: the exact ranking is "
                f"computed down to offset + k), got offset={offset} + k={k} = {offset + k}",
                "offset",
            )
        if n_queries * (offset + k) > settings.max_hits:
            raise FieldError(
                f"{n_queries} queries x (offset={offset} + k={k}) ranks {n_queries * (offset + k)} hits; at "
                f"most {settings.max_hits} per request (setting ESP_MAX_HITS): send fewer queries or a "
                "smaller offset",
                "offset",
            )
    chosen: tuple[tuple[str, FieldType], ...] | None = None
    if fields is not None:
        allowed = {} if schema is None else schema.fields
        for i, name in enumerate(fields):
            if name not in allowed:
                raise FieldError(
                    f"fields[{i}]: {name!r} is not a metadata field of the served corpus; allowed: "
                    f"{list(allowed)}",
                    f"fields[{i}]",
                )
        chosen = tuple((name, allowed[name]) for name in dict.fromkeys(fields))
    return SearchPage(k=k, offset=offset, score_threshold=score_threshold, fields=chosen)
