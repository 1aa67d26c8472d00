"""Read endpoints for operating points and experiments (the A/B platform's view of the registry).

- ``GET /v1/operating-points``: every named weight vector, its description, offline metrics
  and where it came from (``registry`` file or ``bundle`` manifest), plus the default.
- ``GET /v1/experiments``: experiments with their arms (shares, operating points), traffic and
  default arm. The salt is not published (anyone holding it could precompute assignments);
  ``salt_fingerprint`` changes whenever the salt does, so a reshuffle is visible.
- ``GET /v1/experiments/{name}/assignment?unit_id=...``: the arm a unit gets, its operating
  point and full weights; exactly what a search with ``experiment`` + ``unit_id`` would use.

All read ``request.app.state.registry`` (a :class:`RegistryWatcher`), one snapshot per request.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from esp_retrieval.service.errors import NotFoundError, NotReadyError
from esp_retrieval.service.schemas import AssignmentOut, ExperimentsOut, OperatingPointsOut
from esp_retrieval.service.tuning import Registry, RegistryWatcher

router = APIRouter(tags=["registry"])


def _registry(request: Request) -> Registry:
    watcher: RegistryWatcher | None = request.app.state.registry
    if watcher is None:
        raise NotReadyError("the operating-point registry is not loaded yet")
    return watcher.current


@router.get("/v1/operating-points", response_model=OperatingPointsOut)
def list_operating_points(request: Request) -> dict[str, Any]:
    registry = _registry(request)
    return {
        "default_operating_point": registry.default_operating_point,
        "operating_points": [p.to_dict() for p in registry.operating_points.values()],
    }


@router.get("/v1/experiments", response_model=ExperimentsOut)
def list_experiments(request: Request) -> dict[str, Any]:
    return {"experiments": [e.to_dict() for e in _registry(request).experiments.values()]}


@router.get("/v1/experiments/{name}/assignment", response_model=AssignmentOut)
def get_assignment(
    request: Request,
    name: Annotated[str, Path(description="experiment name")],
    unit_id: Annotated[str, Query(min_length=1, max_length=512, description="the unit (user, session) id")],
) -> dict[str, Any]:
    registry = _registry(request)
    if name not in registry.experiments:
        raise NotFoundError(f"unknown experiment {name!r}; defined: {sorted(registry.experiments)}", "name")
    a = registry.assignment(name, unit_id)
    point = registry.operating_points[a.arm.operating_point]
    return {
        "experiment": name,
        "unit_id": unit_id,
        "arm": a.arm.name,
        "included": a.included,
        "operating_point": point.name,
        "weights": dict(point.weights),
    }
