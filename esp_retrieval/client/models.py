"""The SDK's own models of the service's answers (pydantic), independent of the server's code.

Lenient where the server is strict: a field this client does not know is kept (``model_extra``)
rather than refused, so an older client keeps working against a newer server that adds fields.
A test (``tests/client/test_models.py``) checks that every field of the server's response
schemas is here with a type that accepts it, so the two cannot drift apart silently.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Answer(BaseModel):
    """Base of the answer models: unknown fields are kept, not refused."""

    model_config = ConfigDict(extra="allow")

    def __getitem__(self, key: str) -> Any:
        """``answer["field"]`` as well as ``answer.field`` (the registry reads were plain JSON)."""
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


class Hit(_Answer):
    """One ranked document: ``score`` is the weighted sum of ``subspace_scores`` (cosines, and a
    weighted sparse block's score)."""

    id: str
    score: float
    subspace_scores: dict[str, float]
    text: str | None = None
    title: str | None = None
    url: str | None = None
    fields: dict[str, str | int | float | bool | None] | None = None  # the request's ``fields``


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


class SparseInfo(_Answer):
    name: str
    kind: str
    vocab_size: int
    default_weight: float


class LayoutResponse(_Answer):
    dim: int
    subspaces: list[SubspaceInfo]
    default_weights: dict[str, float]  # every weight a request may set: subspaces, then sparse blocks
    bundle_version: str
    metadata_fields: dict[str, str] = {}  # field -> type; a filter may name any but type 'text'
    sparse: list[SparseInfo] = []  # sparse blocks (BM25), weighed by name like a subspace


class Health(_Answer):
    status: str


class BundleRollout(_Answer):
    """Where a replica stands with the bundle the registry file names."""

    state: str
    path: str | None = None
    sha256: str | None = None
    reason: str | None = None
    since: float | None = None


class Readiness(_Answer):
    """``status`` is ``"ready"`` (a 503 answer is raised as :class:`esp_retrieval.client.ESPError`)."""

    status: str
    bundle_version: str | None = None
    backend: str | None = None
    num_docs: int | None = None
    reason: str | None = None
    bundle_sha256: str | None = None
    rollout: BundleRollout | None = None


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
    "SparseInfo",
    "SubspaceInfo",
]


class EmbeddingItem(_Answer):
    object: str = "embedding"
    embedding: list[float] | str
    index: int


class Usage(_Answer):
    prompt_tokens: int
    total_tokens: int


class EmbeddingBlock(_Answer):
    name: str
    offset: int
    dim: int
    weight: float


class EmbeddingsResponse(_Answer):
    """``POST /v1/embeddings`` (the OpenAI shape, plus the blocks and weights applied)."""

    object: str = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage
    subspaces: list[EmbeddingBlock]
    weights_used: dict[str, float] | None = None
    operating_point: str | None = None


class ModelCard(_Answer):
    """One entry of ``GET /v1/models``: the served encoder, named by its bundle version."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "esp-retrieval"


class ModelList(_Answer):
    """``GET /v1/models`` (the OpenAI shape)."""

    object: str = "list"
    data: list[ModelCard]


class KeywordRow(_Answer):
    keyword: str
    cluster_id: int
    cluster_label: str | None = None
    intent: str | None = None
    intent_probability: float | None = None
    similarity_to_label: float | None = None


class ClusterSummary(_Answer):
    cluster_id: int
    size: int
    label: str
    intent_mix: dict[str, int]
    mean_similarity_to_label: float


class Duplicate(_Answer):
    index: int
    duplicate_of: int


class ClusterResponse(_Answer):
    """``POST /v1/cluster``."""

    keywords: list[KeywordRow]
    clusters: list[ClusterSummary]
    noise: int
    duplicates: list[Duplicate]
    weights_used: dict[str, float]
    operating_point: str | None = None
    method: str
    params: dict[str, Any]
    bundle_version: str


class OperatingPoint(_Answer):
    name: str
    weights: dict[str, float]
    description: str
    metrics: dict[str, Any]
    source: str


class OperatingPoints(_Answer):
    """``GET /v1/operating-points``."""

    default_operating_point: str | None = None
    operating_points: list[OperatingPoint]


class Arm(_Answer):
    name: str
    share: float
    operating_point: str


class Experiment(_Answer):
    name: str
    description: str
    enabled: bool
    traffic: float
    default_arm: str | None = None
    salt_fingerprint: str
    arms: list[Arm]


class Experiments(_Answer):
    """``GET /v1/experiments``."""

    experiments: list[Experiment]


class Assignment(_Answer):
    """``GET /v1/experiments/{name}/assignment``."""

    experiment: str
    unit_id: str
    arm: str
    included: bool
    operating_point: str
    weights: dict[str, float]


class UpsertResponse(_Answer):
    """``POST /v1/documents``."""

    upserted: int
    ids: list[str]
    backend: str
    consistency: str


class DeleteResponse(_Answer):
    """``DELETE /v1/documents/{id}``."""

    deleted: str
    backend: str
    consistency: str
