"""Request and response bodies of the HTTP API, every route's, in one place (pydantic models).

Strict where coercion would hide a bug: a boolean is not a weight, ``"5"`` is not ``k``, NaN
and infinity are not numbers. Limits that depend on settings (queries per request, largest
``k``) and on the served layout (subspace names, vector length) are checked by the route,
which answers the same error body (:mod:`esp_retrieval.service.errors`).

Unions are tagged by a callable discriminator so a bad value yields one error for the branch
the caller meant. Tag names contain characters a layout name cannot (upper case, ``-``), so
the error handler can drop them from the dotted field path (:data:`UNION_TAGS`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from esp_retrieval.service.errors import ErrorKind
from esp_retrieval.subspace.clustering import METHODS
from esp_retrieval.subspace.filters import FILTER_TAGS, Filter

MAX_TEXT_CHARS = 10_000
MAX_NAME_CHARS = 200
MAX_FIELDS = 256  # metadata fields one search may ask for

#: Discriminator tags; they appear in pydantic's error locations and are removed from ``field``.
UNION_TAGS = frozenset({"By-Name", "In-Order", "Full", "Per-Subspace", *FILTER_TAGS})

MAX_WEIGHT = 1e6  # ratios beyond this are "infinitely more important" anyway; bounds every score
Weight = Annotated[float, Field(strict=True, ge=0, le=MAX_WEIGHT, allow_inf_nan=False)]
Component = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Name = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_NAME_CHARS)]


def _dict_or_list(value: Any) -> str | None:
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, list):
        return "list"
    return None


WeightsByName = Annotated[dict[Name, Weight], Tag("By-Name")]
WeightsInOrder = Annotated[list[Weight], Tag("In-Order")]
Weights = Annotated[
    WeightsByName | WeightsInOrder,
    Discriminator(
        lambda v: {"dict": "By-Name", "list": "In-Order"}.get(_dict_or_list(v) or ""),
        custom_error_type="weights_type",
        custom_error_message="must be an object {subspace: weight} or a list of weights in layout order",
    ),
]

FullVector = Annotated[list[Component], Tag("Full")]
PerSubspaceVector = Annotated[dict[Name, list[Component]], Tag("Per-Subspace")]
Vector = Annotated[
    FullVector | PerSubspaceVector,
    Discriminator(
        lambda v: {"dict": "Per-Subspace", "list": "Full"}.get(_dict_or_list(v) or ""),
        custom_error_type="vector_type",
        custom_error_message="must be a list of D numbers or an object {subspace: [numbers]}",
    ),
]


class Query(BaseModel):
    """One query: exactly one of ``text`` (encoded by the bundle's encoder) or ``vector``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)] | None = Field(
        None, description="query text, encoded by the bundle's query encoder"
    )
    vector: Vector | None = Field(
        None,
        description="a query embedding: all D components in layout order, or {subspace: block}; "
        "each block is L2-normalised by the service, missing blocks count as zero",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Query:
        if (self.text is None) == (self.vector is None):
            raise ValueError("give exactly one of 'text' or 'vector'")
        if self.text is not None and not self.text.strip():
            raise ValueError("text must contain a non-space character")
        return self


class SearchRequest(BaseModel):
    """A batch of queries, ``k``, and at most one source of weights for all of them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[Query] = Field(
        ..., min_length=1, description="1 .. max_queries queries (setting ESP_MAX_QUERIES)"
    )
    k: int = Field(10, ge=1, description="hits per query, 1 .. max_k (setting ESP_MAX_K)")
    offset: int = Field(
        0,
        ge=0,
        description="hits of the exact ranking skipped first (pagination: offset = page x k); "
        "offset + k at most max_k (setting ESP_MAX_K)",
    )
    score_threshold: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = Field(
        None, description="only hits whose score is >= this (fewer than k when the ranking falls below it)"
    )
    fields: Annotated[list[Name], Field(max_length=MAX_FIELDS)] | None = Field(
        None,
        description="metadata fields (GET /v1/layout metadata_fields) each hit returns in its object "
        "'fields' (null where a document has none); without it hits carry the display fields "
        "text, title, url",
    )
    weights: Weights | None = Field(
        None,
        description="per-subspace weights (finite, >= 0, not all zero), keyed by the layout's names and "
        "its sparse blocks' (e.g. bm25; they score the query text); names missing from an object take "
        "the default weight",
    )
    operating_point: Name | None = Field(None, description="a named weight vector from the registry")
    experiment: Name | None = Field(None, description="an A/B experiment; needs unit_id")
    unit_id: Name | None = Field(None, description="the unit (user, session) assigned to an arm")
    filter: Filter | None = Field(
        None,
        description="only documents whose metadata (docs.jsonl fields) match: "
        "{field, eq | in | gt/gte/lt/lte} or {and: [...]}, {or: [...]}, {not: ...}; exact top k among them",
    )


class Hit(BaseModel):
    id: str
    score: float = Field(description="sum over subspaces of weight * subspace score")
    subspace_scores: dict[str, float] = Field(
        description="cosine of each subspace block; with a weighted sparse block, its score too")
    text: str | None = Field(None, description="display text, when the bundle has docs.jsonl")
    title: str | None = None
    url: str | None = None
    fields: dict[str, str | int | float | bool | None] | None = Field(
        None, description="the request's fields of the document, in their metadata types (null: no value)"
    )


class QueryResult(BaseModel):
    hits: list[Hit]


class SearchResponse(BaseModel):
    results: list[QueryResult] = Field(description="one per query, in request order")
    weights_used: dict[str, float]
    operating_point: str | None = None
    experiment: str | None = None
    arm: str | None = None
    in_experiment: bool | None = Field(
        None,
        description="with an experiment: true when the unit is inside its traffic (an exposure, counted "
        "per arm); false when it is outside the traffic or the experiment is disabled, and the "
        "default arm served it. null without an experiment",
    )
    bundle_version: str
    backend: str


class SubspaceInfo(BaseModel):
    name: str
    dim: int
    offset: int
    loss: str
    default_weight: float


class SparseInfo(BaseModel):
    name: str
    kind: str
    vocab_size: int
    default_weight: float


class LayoutResponse(BaseModel):
    dim: int
    subspaces: list[SubspaceInfo]
    default_weights: dict[str, float] = Field(
        description="every weight a request may set: the subspaces, then the sparse blocks")
    bundle_version: str
    sparse: list[SparseInfo] = Field(
        default_factory=list, description="sparse blocks (BM25 over the corpus vocabulary), weighed by name")
    metadata_fields: dict[str, str] = Field(
        default_factory=dict,
        description="the corpus' metadata fields with their types: a search filter may name any but "
        "those of type text (display text, returned in a hit's fields, not filterable)",
    )


class Health(BaseModel):
    status: str


class BundleRollout(BaseModel):
    """Where this replica stands with the bundle the registry file names (esp_retrieval.service.rollout)."""

    path: str | None = Field(None, description="the bundle directory the registry file names")
    sha256: str | None = Field(None, description="the manifest.json sha256 it names")
    state: str = Field(description="none (no bundle named), pending, loading, in_sync or refused")
    reason: str | None = Field(None, description="why it is pending or was refused")
    since: float | None = Field(None, description="unix time of the last change of state")


class Readiness(BaseModel):
    status: str = Field(description="'ready' or 'not_ready'")
    bundle_version: str | None = None
    backend: str | None = None
    num_docs: int | None = None
    reason: str | None = Field(None, description="why the service is not ready")
    bundle_sha256: str | None = Field(None, description="sha256 of the served bundle's manifest.json")
    rollout: BundleRollout | None = Field(None, description="null without a registry file")


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        None,
        description="bundle directory to load, or the URI of one in object storage (s3://, gs://, "
        "http(s)://, file://; fetched, then loaded); default: the one served now",
    )
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        None,
        description="sha256 of the bundle's manifest.json (esp bundle-info prints it); required with a "
        "URI, which is refused before anything else is fetched when its manifest has another digest",
    )


class ReloadResponse(BaseModel):
    bundle_version: str
    previous_version: str | None
    path: str
    num_docs: int
    backend: str
    seconds: float = Field(description="time to load, validate and warm the new bundle")


class ErrorBody(BaseModel):
    """The one error shape of the service."""

    type: ErrorKind
    message: str
    field: str | None = Field(None, description="dotted path of the offending value, if any")


class OpenAIError(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, not_found_error, rate_limit_error or server_error")
    param: str | None = Field(None, description="dotted path of the offending value, if any")
    code: str | None = Field(
        None, description="the reason: token_ids_not_supported, too_many_tokens, or this service's error type"
    )


class OpenAIErrorBody(BaseModel):
    """Errors of the OpenAI-compatible routes (/v1/embeddings, /v1/models), in OpenAI's shape."""

    error: OpenAIError


def error_responses(*statuses: int, openai: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting :class:`ErrorBody` (``openai``:
    :class:`OpenAIErrorBody`) for ``statuses``."""
    text = {
        401: "missing bearer token",
        403: "wrong bearer token",
        404: "not found (admin routes: disabled because no admin token is configured)",
        409: "the new bundle was refused; the old one is still served",
        413: "request body larger than max_body_bytes",
        422: "invalid input; `field` names the offending value",
        429: "micro-batch queue full; retry after the Retry-After header's seconds",
        503: "no bundle loaded and warmed yet",
    }
    model = OpenAIErrorBody if openai else ErrorBody
    return {s: {"model": model, "description": text.get(s, "error")} for s in statuses}


# --- POST /v1/cluster (esp_retrieval.service.routes.cluster) ----------------------------------------------

Keyword = Annotated[str, Field(strict=True, max_length=MAX_TEXT_CHARS)]


class ClusterRequest(BaseModel):
    """Keywords, at most one source of weights, and the method with its main parameter."""

    model_config = ConfigDict(extra="forbid", strict=True)

    keywords: list[Keyword] = Field(
        ..., min_length=1, description="1 .. max_cluster_keywords keywords (setting ESP_MAX_CLUSTER_KEYWORDS)"
    )
    weights: Weights | None = Field(
        None, description="per-subspace weights; names missing from an object take the default"
    )
    operating_point: Name | None = Field(None, description="a named weight vector from the registry")
    method: Name = Field("agglomerative", description=f"one of {sorted(METHODS)}")
    threshold: Annotated[float, Field(strict=True, ge=0, le=2, allow_inf_nan=False)] | None = Field(
        None, description="agglomerative: merge while 1 - similarity / sum(weights) <= threshold (0.4)"
    )
    min_cluster_size: Annotated[int, Field(strict=True, ge=2)] | None = Field(
        None, description="hdbscan: the smallest cluster; smaller groups are noise (3)"
    )


class KeywordRow(BaseModel):
    keyword: str
    cluster_id: int = Field(description="-1: unclustered (HDBSCAN noise)")
    cluster_label: str | None = Field(description="the cluster's most central keyword; null for noise")
    intent: str | None = Field(description="the intent head's prediction; null without an intent head")
    intent_probability: float | None
    similarity_to_label: float | None = Field(
        description="similarity / sum(weights); null for noise"
    )


class ClusterSummary(BaseModel):
    cluster_id: int
    size: int
    label: str
    intent_mix: dict[str, int] = Field(description="predicted intents of the members, most frequent first")
    mean_similarity_to_label: float


class Duplicate(BaseModel):
    index: int = Field(description="position of the dropped keyword in the request")
    duplicate_of: int = Field(description="position of the kept spelling")


class ClusterResponse(BaseModel):
    keywords: list[KeywordRow] = Field(description="every distinct keyword once, in request order")
    clusters: list[ClusterSummary] = Field(description="by decreasing size")
    noise: int = Field(description="keywords in no cluster (cluster_id -1)")
    duplicates: list[Duplicate]
    weights_used: dict[str, float]
    operating_point: str | None = None
    method: str
    params: dict[str, Any]
    bundle_version: str


# --- operating points and experiments (esp_retrieval.service.routes.tuning) ---------------------------------

class OperatingPointOut(BaseModel):
    name: str
    weights: dict[str, float] = Field(description="weight per subspace, every subspace of the layout")
    description: str
    metrics: dict[str, Any] = Field(description="offline metrics measured at these weights, if known")
    source: str = Field(description="'registry' (the registry file) or 'bundle' (the bundle manifest)")


class OperatingPointsOut(BaseModel):
    default_operating_point: str | None = Field(
        description="used when a query names no weights, operating point or experiment"
    )
    operating_points: list[OperatingPointOut]


class ArmOut(BaseModel):
    name: str
    share: float
    operating_point: str


class ExperimentOut(BaseModel):
    name: str
    description: str
    enabled: bool
    traffic: float = Field(description="fraction of units in the experiment; the rest get default_arm")
    default_arm: str | None
    salt_fingerprint: str = Field(description="sha256(salt)[:12]: changes when the arms are reshuffled")
    arms: list[ArmOut]


class ExperimentsOut(BaseModel):
    experiments: list[ExperimentOut]


class AssignmentOut(BaseModel):
    experiment: str
    unit_id: str
    arm: str
    included: bool = Field(
        description="false when the unit is outside the experiment's traffic (or the experiment is "
        "disabled) and is served the default arm: not an exposure"
    )
    operating_point: str
    weights: dict[str, float]


# --- POST /v1/embeddings, GET /v1/models (esp_retrieval.service.routes.embeddings) -------------------------

InputText = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_TEXT_CHARS)]

#: Why token ids are refused, and what each client should do instead.
TOKEN_IDS_MESSAGE = (
    "input holds token ids; this service tokenizes text with its own encoder's tokenizer, and ids from "
    "another (tiktoken's) would mean other words: send the texts as strings. LangChain's "
    "OpenAIEmbeddings sends token ids unless it is built with check_embedding_ctx_length=False"
)


def _is_token_ids(value: Any) -> bool:
    """A list of integers, or a list of such lists (OpenAI's token-array inputs)."""

    def ints(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(type(i) is int for i in x)

    return ints(value) or (isinstance(value, list) and bool(value) and all(ints(x) for x in value))


class EmbeddingsRequest(BaseModel):
    """The OpenAI embeddings request (text inputs), plus the optional choice of blocks and weights."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: InputText | list[InputText] = Field(
        ...,
        description="a text or a list of 1 .. ESP_MAX_EMBEDDING_INPUTS (2,048) texts holding at most "
        "ESP_MAX_EMBEDDING_TOKENS tokens together; token ids are refused (send strings; LangChain: "
        "check_embedding_ctx_length=False)",
    )
    model: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="accepted for compatibility and ignored; the response names the bundle version"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="'float': a list of numbers; 'base64': little-endian float32 bytes"
    )
    dimensions: Annotated[int, Field(strict=True, ge=1)] | None = Field(
        None,
        description="if given, must equal the returned dimension: a prefix of concatenated unit-norm "
        "blocks is no smaller embedding, so vectors are not truncated (choose blocks with subspaces)",
    )
    user: Annotated[str, Field(max_length=200)] | None = Field(None, description="accepted and ignored")
    subspaces: Annotated[list[Name], Field(min_length=1)] | None = Field(
        None, description="only these subspace blocks, concatenated in layout order (default: all)"
    )
    weights: Weights | None = Field(
        None,
        description="scale each block by its weight (names missing from an object take the default); "
        "default: every block unscaled",
    )
    operating_point: Name | None = Field(
        None, description="scale each block by a registry operating point's weights"
    )

    @field_validator("input", mode="before")
    @classmethod
    def _no_token_ids(cls, value: Any) -> Any:
        if _is_token_ids(value):
            code = {"openai_code": "token_ids_not_supported"}
            raise PydanticCustomError("token_ids", TOKEN_IDS_MESSAGE, code)
        return value


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str = Field(description="the vector, or its base64 float32 bytes")
    index: int = Field(description="position of the input text")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class BlockOut(BaseModel):
    name: str
    offset: int = Field(description="where the block starts in the returned vector")
    dim: int
    weight: float = Field(description="the factor the (unit-norm) block was multiplied by")


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str = Field(description="the bundle version whose encoder produced the vectors")
    usage: Usage
    subspaces: list[BlockOut] = Field(description="the blocks of the returned vectors, in order")
    weights_used: dict[str, float] | None = Field(
        None, description="the weights applied (null: unscaled blocks)"
    )
    operating_point: str | None = None


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models`` (OpenAI's model object)."""

    id: str = Field(description="the served bundle's version: what /v1/embeddings answers as 'model'")
    object: Literal["model"] = "model"
    created: int = Field(description="unix time the bundle's manifest was written")
    owned_by: str = "esp-retrieval"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- POST /v1/documents, DELETE /v1/documents/{id} (esp_retrieval.service.routes.documents) ----------------

MAX_DOCUMENTS = 256
MAX_ID_CHARS = 1024

_Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
FieldValue = Annotated[StrictBool | StrictInt | _Number | StrictStr | None, Field(union_mode="left_to_right")]
DocId = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_ID_CHARS)]


class DocumentIn(BaseModel):
    """One document to insert or replace (by ``id``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: DocId
    text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)] | None = Field(
        None, description="display text; encoded by the bundle's document encoder when no vector is given"
    )
    vector: Vector | None = Field(None, description="the document embedding: D numbers or {subspace: block}")
    fields: dict[Annotated[str, Field(min_length=1, max_length=64)], FieldValue] = Field(
        default_factory=dict, description="metadata values by declared field (null: absent)"
    )

    @model_validator(mode="after")
    def _vector_or_text(self) -> DocumentIn:
        if self.vector is None and self.text is None:
            raise ValueError("give a 'vector', or a 'text' to encode")
        return self


class UpsertRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    documents: list[DocumentIn] = Field(..., min_length=1, max_length=MAX_DOCUMENTS)


class UpsertResponse(BaseModel):
    upserted: int
    ids: list[str]
    backend: str
    consistency: str = Field(description="searches started after this answer see the writes")


class DeleteResponse(BaseModel):
    deleted: str
    backend: str
    consistency: str
