"""The search wing's parts in one typed object, and the one dependency of ``POST /v1/search``.

:class:`SearchPipeline` is made once per app (``app.state.search``, by
:func:`esp_retrieval.service.app.create_app`); the app's lifespan gives it the micro-batcher, the registry
watcher and the exposure log at start-up and takes them back at shutdown. The admission
middleware is built with it and the route reads it through :func:`search_context`: no
attribute probing on ``app.state``, no context variables.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from esp_retrieval.service.config import Settings
from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.service.exposure import ExposureLog
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.search.batching import MicroBatcher
from esp_retrieval.service.search.wait import ARRIVAL, Arrival
from esp_retrieval.service.state import ServingState, StateHolder
from esp_retrieval.service.tracing import DISABLED, Tracing
from esp_retrieval.service.tuning import RegistryWatcher


@dataclass(slots=True)
class SearchPipeline:
    """What a search passes through, from admission to the answer. ``batcher``, ``registry``
    and ``exposure`` are None before start-up and after shutdown."""

    settings: Settings
    metrics: Metrics
    holder: StateHolder
    tracing: Tracing = DISABLED
    batcher: MicroBatcher | None = None
    registry: RegistryWatcher | None = None
    exposure: ExposureLog | None = None


@dataclass(frozen=True, slots=True)
class SearchContext:
    """What one search needs, resolved by one dependency instead of five: FastAPI's dependency
    solving costs tens of microseconds per dependency on the hottest route."""

    state: ServingState
    settings: Settings
    batcher: MicroBatcher
    metrics: Metrics
    registry: RegistryWatcher
    receive: Callable[[], Awaitable[Any]] | None = None  # the ASGI receive: tells a disconnect
    exposure: ExposureLog | None = None  # the exposure log (esp_retrieval.service.exposure)
    tracing: Tracing = DISABLED  # spans of the search's stages (esp_retrieval.service.tracing)
    arrival: Arrival | None = None  # set by the admission middleware (esp_retrieval.service.search.admission)


async def search_context(request: Request) -> SearchContext:
    """The served state (503 when none is ready) and the pipeline's parts, captured once."""
    pipeline: SearchPipeline = request.app.state.search
    state = pipeline.holder.require()
    batcher, registry = pipeline.batcher, pipeline.registry
    if batcher is None or registry is None:
        raise NotReadyError("not ready: the service is starting or stopping", retry_after=1.0)
    arrival = request.scope.get(ARRIVAL)
    return SearchContext(
        state, pipeline.settings, batcher, pipeline.metrics, registry, request.receive,
        exposure=pipeline.exposure, tracing=pipeline.tracing, arrival=arrival,
    )


SearchContextDep = Annotated[SearchContext, Depends(search_context)]
