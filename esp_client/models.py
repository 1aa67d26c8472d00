"""The SDK's own models of the service's answers (pydantic), independent of the server's code.

Lenient where the server is strict: a field this client does not know is kept (``model_extra``)
rather than refused, so an older client keeps working against a newer server that adds fields.
A test (``tests/esp_client/test_models.py``) checks that every field of the server's response
schemas is here with a type that accepts it, so the two cannot drift apart silently.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Answer(BaseModel):
    """Base of the answer models: unknown fields are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class Hit(_Answer):
    """One ranked document: ``score`` is the weighted sum of ``subspace_scores`` (cosines)."""

    id: str
    score: float
    subspace_scores: dict[str, float]
    text: str | None = None
    title: str | None = None
    url: str | None = None


class QueryResult(_Answer):
    hits: list[Hit]


class SearchResponse(_Answer):
    """``results``: one per query, in request order. ``in_experiment`` is None without an experiment."""

    results: list[QueryResult]
    weights_used: dict[str, float]
    bundle_version: str
    backend: str
    operating_point: str | None = None
    experiment: str | None = None
    arm: str | None = None
    in_experiment: bool | None = None


class SubspaceInfo(_Answer):
    name: str
    dim: int
    offset: int
    loss: str
    default_weight: float


class LayoutResponse(_Answer):
    dim: int
    subspaces: list[SubspaceInfo]
    default_weights: dict[str, float]
    bundle_version: str


class Health(_Answer):
    status: str


class Readiness(_Answer):
    """``status`` is ``"ready"`` (a 503 answer is raised as :class:`esp_client.ESPError`)."""

    status: str
    bundle_version: str | None = None
    backend: str | None = None
    num_docs: int | None = None
    reason: str | None = None


class ReloadResponse(_Answer):
    """``seconds``: the time the server took to load, validate and warm the new bundle."""

    bundle_version: str
    previous_version: str | None = None
    path: str
    num_docs: int
    backend: str
    seconds: float


__all__ = [
    "Health",
    "Hit",
    "LayoutResponse",
    "QueryResult",
    "Readiness",
    "ReloadResponse",
    "SearchResponse",
    "SubspaceInfo",
]
