"""Shared route dependencies: settings, the served state (503 until ready), the app's singletons.

All are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies on its thread pool,
a hop per dependency per request that costs more than the work they do. Settings come from
``app.state.settings`` (set by :func:`esp_retrieval.service.app.create_app`, default :func:`get_settings`);
tests pass their own to ``create_app(settings)`` or override :func:`app_settings`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from esp_retrieval.service.config import Settings
from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.state import ServingState, StateHolder


async def app_settings(request: Request) -> Settings:
    s: Settings = request.app.state.settings
    return s


async def holder(request: Request) -> StateHolder:
    h: StateHolder = request.app.state.holder
    return h


async def metrics(request: Request) -> Metrics:
    m: Metrics = request.app.state.metrics
    return m


async def serving_state(request: Request) -> ServingState:
    """The state served now, captured once for the whole request; 503 when none is ready."""
    h: StateHolder = request.app.state.holder
    return h.require()


SettingsDep = Annotated[Settings, Depends(app_settings)]
HolderDep = Annotated[StateHolder, Depends(holder)]
MetricsDep = Annotated[Metrics, Depends(metrics)]
StateDep = Annotated[ServingState, Depends(serving_state)]
