"""Shared route dependencies: settings, the served state (503 until ready), the app's singletons.

All are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies on its thread pool,
a hop per dependency per request that costs more than the work they do. Settings come from
``app.state.settings`` (set by :func:`service.app.create_app`, default :func:`get_settings`);
tests pass their own to ``create_app(settings)`` or override :func:`app_settings`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from service.batching import MicroBatcher
from service.config import Settings
from service.errors import NotReadyError
from service.exposure import ExposureLog
from service.metrics import Metrics
from service.registry import RegistryWatcher
from service.state import ServingState, StateHolder
from service.tracing import DISABLED, Tracing


async def app_settings(request: Request) -> Settings:
    s: Settings = request.app.state.settings
    return s


async def holder(request: Request) -> StateHolder:
    h: StateHolder = request.app.state.holder
    return h


async def metrics(request: Request) -> Metrics:
    m: Metrics = request.app.state.metrics
    return m


async def batcher(request: Request) -> MicroBatcher:
    b: MicroBatcher = request.app.state.batcher
    return b


async def serving_state(request: Request) -> ServingState:
    """The state served now, captured once for the whole request; 503 when none is ready."""
    h: StateHolder = request.app.state.holder
    state = h.current
    if state is None:
        reason = h.error or "the bundle is still loading"
        raise NotReadyError(f"not ready: {reason}", retry_after=1.0)
    return state


@dataclass(frozen=True, slots=True)
class SearchContext:
    """What ``POST /v1/search`` needs, resolved by one dependency instead of five: FastAPI's
    dependency solving costs tens of microseconds per dependency on the hottest route."""

    state: ServingState
    settings: Settings
    batcher: MicroBatcher
    metrics: Metrics
    registry: RegistryWatcher
    receive: Callable[[], Awaitable[Any]] | None = None  # the ASGI receive: tells a disconnect
    exposure: ExposureLog | None = None  # the exposure log (service.exposure)
    tracing: Tracing = DISABLED  # spans of the search's stages (service.tracing)


async def search_context(request: Request) -> SearchContext:
    """The served state (503 when none, as :func:`serving_state`) and the app's singletons."""
    state = await serving_state(request)
    app_state = request.app.state
    return SearchContext(
        state, app_state.settings, app_state.batcher, app_state.metrics, app_state.registry, request.receive,
        exposure=getattr(app_state, "exposure", None), tracing=getattr(app_state, "tracing", DISABLED),
    )


SettingsDep = Annotated[Settings, Depends(app_settings)]
HolderDep = Annotated[StateHolder, Depends(holder)]
MetricsDep = Annotated[Metrics, Depends(metrics)]
BatcherDep = Annotated[MicroBatcher, Depends(batcher)]
StateDep = Annotated[ServingState, Depends(serving_state)]
SearchContextDep = Annotated[SearchContext, Depends(search_context)]
