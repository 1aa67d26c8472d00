"""Metadata filters in the service: the fields a served state declares, and a filtered view of it.

:func:`filter_context` gives, once per engine, the :class:`~esp_retrieval.subspace.filters.MetadataSchema`
requests are checked against (a Milvus collection's own, else the bundle's ``docs.jsonl``
fields) and, built on first use, the :class:`~esp_retrieval.subspace.filters.MetadataTable` the in-process
backends mask with. :func:`filtered` wraps a :class:`~esp_retrieval.service.state.ServingState` so that its
``search`` applies one compiled filter: exact row masks for in-process backends, expressions
for a backend that filters itself (``capabilities.native_filters``). The wrapper shares the
state's engine, bundle and lifetime, and is its own object, so the micro-batcher scores a
filtered request in its own engine call (its batches group jobs by state).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from esp_retrieval.service.state import ServingState
from esp_retrieval.subspace.engine.base import Backend, SearchResult
from esp_retrieval.subspace.engine.sparse_terms import SparseQuery
from esp_retrieval.subspace.filters import CompiledFilter, MetadataSchema, MetadataTable, compile_filter

_MASKS_KEPT = 16  # recent filters' masks per engine (a mask is N bytes)


class FilterContext:
    """The declared fields of one served corpus; its metadata columns, built when first needed."""

    def __init__(self, state: ServingState) -> None:
        engine = state.engine
        own = engine.metadata_schema if engine.capabilities.metadata else None
        self.schema: MetadataSchema = (
            own if own is not None else MetadataSchema.of_bundle(state.bundle.manifest, state.docs)
        )
        self._docs = state.docs
        self._rows = state.engine.num_docs
        self._table: MetadataTable | None = None
        self._masks: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: Any) -> CompiledFilter:
        return compile_filter(spec, self.schema)

    def mask(self, compiled: CompiledFilter) -> np.ndarray:
        """The rows the filter allows, ``(N,)`` bool (recent masks are kept)."""
        with self._lock:
            if compiled.key in self._masks:
                self._masks.move_to_end(compiled.key)
                return self._masks[compiled.key]
            if self._table is None:
                self._table = MetadataTable(self.schema, self._docs, self._rows)
            mask = compiled.mask(self._table)
            self._masks[compiled.key] = mask
            if len(self._masks) > _MASKS_KEPT:
                self._masks.popitem(last=False)
            return mask


_contexts: weakref.WeakKeyDictionary[Backend, FilterContext] = weakref.WeakKeyDictionary()
_contexts_lock = threading.Lock()


def filter_context(state: ServingState) -> FilterContext:
    with _contexts_lock:
        ctx = _contexts.get(state.engine)
        if ctx is None:
            ctx = _contexts[state.engine] = FilterContext(state)
        return ctx


@dataclass(frozen=True, eq=False)
class FilteredState(ServingState):
    """A served state whose searches apply one filter (see the module docstring)."""

    compiled: CompiledFilter | None = None

    def search(
        self, queries: np.ndarray, block_weights: np.ndarray, k: int,
        sparse: Mapping[str, SparseQuery] | None = None,
    ) -> SearchResult:
        assert self.compiled is not None
        if self.engine.capabilities.native_filters:
            allowed: Any = self.compiled
        else:
            allowed = filter_context(self).mask(self.compiled)
        if sparse is None:
            return self.engine.search(queries, block_weights, k, allowed=allowed)
        return self.engine.search(queries, block_weights, k, allowed=allowed, sparse=sparse)


def filtered(state: ServingState, compiled: CompiledFilter) -> FilteredState:
    """``state`` with every search restricted to the rows ``compiled`` allows."""
    base = {f.name: getattr(state, f.name) for f in fields(state) if f.init and f.name != "compiled"}
    return FilteredState(**base, compiled=compiled)
