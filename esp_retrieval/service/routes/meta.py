"""Liveness, readiness, the served layout, and the Prometheus exposition."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from esp_retrieval.service.filtering import filter_context
from esp_retrieval.service.rollout import status_body
from esp_retrieval.service.routes.deps import MetricsDep, StateDep
from esp_retrieval.service.schemas import (
    Health,
    LayoutResponse,
    Readiness,
    SparseInfo,
    SubspaceInfo,
    error_responses,
)
from esp_retrieval.subspace.weights import weights_dict

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="The process is alive (no bundle needed)")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=error_responses(503),
    summary="200 once a bundle is loaded, validated and a warm-up search ran; else 503",
)
async def readyz(state: StateDep, request: Request) -> Readiness:
    return Readiness(
        status="ready", bundle_version=state.version, backend=state.engine.name, num_docs=state.num_docs,
        **status_body(request.app.state.rollout, state),
    )


@router.get(
    "/v1/layout",
    response_model=LayoutResponse,
    responses=error_responses(503),
    summary="Subspace names, dims, offsets and default weights of the served bundle",
)
async def layout(state: StateDep) -> LayoutResponse:
    lay, names = state.layout, state.weight_layout
    return LayoutResponse(
        dim=lay.dim,
        subspaces=[SubspaceInfo(**o.to_dict()) for o in lay.objectives],
        default_weights=weights_dict(names.default_weights(), names),
        bundle_version=state.version,
        metadata_fields=filter_context(state).schema.to_dict(),
        sparse=[SparseInfo(**e) for e in state.bundle.manifest.get("sparse") or ()],
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition"}},
    summary="Prometheus metrics (names in esp_retrieval.service.metrics.METRIC_NAMES)",
)
async def metrics(m: MetricsDep) -> Response:
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
