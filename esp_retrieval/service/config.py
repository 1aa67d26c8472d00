"""Service settings from the environment (prefix ``ESP_``), e.g. ``ESP_BUNDLE=/models/demo``.

Loaded once via :func:`get_settings` and injected with ``Depends`` so tests override them.
This class (with :class:`~esp_retrieval.service.engine.milvus_backend.MilvusSettings`, ``ESP_MILVUS_*``) is
the one source of the settings: ``docs/settings.md`` is generated from its fields
(``python -m deploy.settings_doc``), and a test fails when either drifts or when a setting is
missing from the Helm chart.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from esp_retrieval.service.bundle_roots import check_bundle_source, parse_roots
from esp_retrieval.service.engine import BACKENDS, PRECISIONS
from esp_retrieval.service.remote_bundle import is_uri


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ESP_", extra="ignore")

    bundle: Path | None = Field(
        None,
        description="bundle directory to serve; an fsspec URI (s3://, gs://, http(s)://, file://) is "
        "taken as bundle_uri",
    )
    bundle_uri: str | None = Field(
        None,
        description="URI of a bundle folder in object storage, fetched into bundle_cache and checked "
        "against bundle_sha256 before it is loaded (esp_retrieval/service/remote_bundle.py)",
    )
    bundle_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the remote bundle's manifest.json (esp bundle-info prints it); required "
        "with bundle_uri",
    )
    bundle_cache: Path = Field(
        Path(tempfile.gettempdir()) / "esp-bundles",
        description="folder remote bundles are fetched into, one sub-folder per manifest digest; the "
        "served and the previous bundle are kept",
    )
    registry: Path | None = Field(
        None, description="operating points / experiments file (YAML or JSON), re-read on change"
    )
    registry_poll_seconds: float = Field(2.0, gt=0, description="how often the registry is checked")
    admin_token: SecretStr | None = Field(
        None, description="bearer token for /v1/admin/*; admin routes are disabled without one"
    )
    host: str = Field("127.0.0.1", description="address the server binds (esp serve --host)")
    port: int = Field(8000, ge=1, le=65535, description="port the server listens on (esp serve --port)")
    backend: str = Field("auto", description=f"engine backend: {', '.join(['auto', *BACKENDS])}")
    precision: str = Field("float32", description=f"index precision: {', '.join(PRECISIONS)}")
    threads: int | None = Field(None, ge=1, description="engine threads (default: all cores)")
    blocking_threads: int | None = Field(
        None,
        ge=1,
        description="threads for blocking work off the event loop (reloads, result building, encoding, "
        "clustering), all started at start-up so the count stays flat (default: min(32, cores + 4))",
    )
    ann_max_touched: float = Field(
        0.05,
        gt=0,
        le=1,
        description="backend ivf (the approximate weight-aware index: the bundle's ann/, else built at "
        "load): the fraction of the corpus one query may scan",
    )
    encoder_device: str = Field(
        "auto", description="query encoder device: auto (CUDA when present, else cpu), cpu, cuda or cuda:N"
    )
    max_queries: int = Field(256, ge=1, description="queries per request")
    max_embedding_inputs: int = Field(
        2048, ge=1, description="texts per POST /v1/embeddings request (OpenAI's limit is 2,048)"
    )
    max_embedding_tokens: int = Field(
        300_000, ge=1,
        description="tokens (as the encoder sees them, truncated at its max_length) summed over one "
        "POST /v1/embeddings request; the bound on its encoder time (OpenAI's cap is 300,000)",
    )
    max_embedding_queue: int = Field(
        8, ge=1,
        description="POST /v1/embeddings requests on the encoder at once (waiting for it or encoding); "
        "one more is answered 429 with Retry-After",
    )
    embedding_deadline_seconds: float = Field(
        30.0, gt=0,
        description="a POST /v1/embeddings request is answered within this: still waiting for the "
        "encoder, 429 with Retry-After (taken off the queue); encoding, 503 with Retry-After (the "
        "encoding stops at its next batch of texts)",
    )
    max_k: int = Field(1000, ge=1, description="largest k a request may ask for")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="request body limit")
    max_batch: int = Field(64, ge=1, description="queries per micro-batch")
    max_wait_ms: float = Field(2.0, ge=0, description="how long the micro-batcher gathers")
    queue_size: int = Field(1024, ge=1, description="queued queries before 429")
    batching: bool = Field(True, description="gather concurrent requests into one engine call")
    max_cluster_keywords: int = Field(2000, ge=1, description="keywords per POST /v1/cluster request")
    otel: bool = Field(
        False,
        description="FastAPI's native OpenTelemetry (to globally configured providers); off by default: "
        "/metrics is the service's telemetry, and FastAPI checks the providers on every request",
    )
    max_cluster_jobs: int = Field(1, ge=1, description="clustering requests run at once; more get 429")
    # --- cost per request and admission (README "Limits") ---
    max_hits: int = Field(
        10_000, ge=1,
        description="queries x (offset + k) per search request (the hits it ranks); more is 422",
    )
    max_response_bytes: int = Field(
        16 * 1024 * 1024, ge=4096, description="largest search response body; a larger one is 422"
    )
    latency_budget_ms: float = Field(
        250.0,
        gt=0,
        description="the served latency objective: a search is refused (429, Retry-After) when the time it "
        "already waited (the event loop's lag included) plus the queue ahead of it at the measured engine "
        "throughput would exceed this; shed at dequeue when it waited this long before the engine took it",
    )
    max_inflight_searches: int | None = Field(
        None,
        ge=1,
        description="searches in progress at once before 429 (default: adapted to the latency budget from "
        "the latency measured of the searches answered, AIMD)",
    )
    max_cluster_tokens: int = Field(
        20_000, ge=1, description="whitespace-separated words over all keywords of one /v1/cluster request"
    )
    cluster_timeout_seconds: float = Field(
        30.0, gt=0, description="a clustering request running longer is answered 503 with Retry-After"
    )
    # --- what may be served ---
    bundle_roots: str = Field(
        "",
        description="comma-separated absolute folders and URI prefixes (s3://models/esp/) a bundle may be "
        "loaded from: the start-up bundle (else the server does not start), POST /v1/admin/reload and the "
        "registry's bundle (else refused, 409, the served bundle kept); a path is checked after symlinks "
        "and '..' are resolved; unset: any bundle (esp_retrieval/service/bundle_roots.py)",
    )
    bundle_permissions: Literal["refuse", "warn"] = Field(
        "refuse", description="a bundle its group or others may write: refuse it, or serve it with a warning"
    )
    allow_no_encoder: bool = Field(
        False,
        description="accept a reload to a bundle without a query encoder while the served one has one "
        "(vector queries only)",
    )
    # --- HTTP (esp serve; README "HTTP limits") ---
    max_header_bytes: int = Field(16384, ge=1024, description="request line + headers in bytes; more is 431")
    max_headers: int = Field(100, ge=1, description="header fields per request; more is 431")
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="a request line and headers not complete after this are answered 408"
    )
    body_timeout_seconds: float = Field(
        10.0, gt=0, description="a request body that sends nothing for this long is answered 408"
    )
    search_body_deadline_seconds: float = Field(
        10.0,
        gt=0,
        description="a search body not complete this long after its headers is answered 408, however "
        "steadily it trickles; a search counts as in flight only once its body is complete",
    )
    keep_alive_seconds: float = Field(5.0, gt=0, description="idle keep-alive connections close after this")
    max_connections: int = Field(
        1000, ge=1, description="open connections + running requests before new requests get 503"
    )
    linger_seconds: float = Field(
        2.0,
        ge=0,
        description="after an early error (413, 408, 431) the server reads and drops what the client still "
        "sends for up to this long before closing, so the client reads the answer instead of a reset",
    )
    # --- operations (README "Operating the service") ---
    log_format: Literal["json", "text"] = Field(
        "json", description="log lines: one JSON object per line (json) or plain text for a terminal (text)"
    )
    exposure_log: Literal["off", "stdout", "file"] = Field(
        "off", description="one JSON record per search served by an experiment arm: off, stdout or file"
    )
    exposure_log_path: Path | None = Field(None, description="the file of exposure_log=file (rotated)")
    exposure_log_max_bytes: int = Field(
        100 * 1024 * 1024, ge=1024, description="exposure log file size before it rotates"
    )
    exposure_log_backups: int = Field(5, ge=0, description="rotated exposure log files kept")
    exposure_sample_rate: float = Field(
        1.0, ge=0, le=1, description="share of exposures logged (by unit id, so a unit is in or out)"
    )
    exposure_hash_unit_id: bool = Field(
        True, description="log sha256(salt:unit_id) instead of the raw unit id (the salt: exposure_salt)"
    )
    exposure_salt: str = Field(
        "",
        description="salt of the hashed unit id in exposure records; empty: a random salt generated at "
        "the first start and kept in exposure_salt_file (a warning says so)",
    )
    exposure_salt_file: Path | None = Field(
        None,
        description="where a generated exposure salt is kept (default: exposure_log_path + '.salt' with "
        "exposure_log=file; none with stdout: a new salt at every start)",
    )
    exposure_include_ids: bool = Field(False, description="add the returned document ids to each record")
    tracing: bool = Field(
        False, description="OpenTelemetry spans of each request and its search stages, sent by OTLP/HTTP"
    )
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces URL (default: the OTEL_EXPORTER_OTLP_* environment variables)"
    )
    trace_sample_ratio: float = Field(1.0, ge=0, le=1, description="share of requests traced (parent-based)")

    @model_validator(mode="before")
    @classmethod
    def _uri_is_no_path(cls, data: Any) -> Any:
        """``ESP_BUNDLE=s3://...`` means ``bundle_uri`` (a Path would fold its ``//``)."""
        if isinstance(data, dict) and isinstance(data.get("bundle"), str) and is_uri(data["bundle"]):
            data = {**data, "bundle_uri": data["bundle"], "bundle": None}
        return data

    @field_validator("bundle_roots")
    @classmethod
    def _roots_parse(cls, value: str) -> str:
        parse_roots(value)  # a relative folder is refused
        return value

    @model_validator(mode="after")
    def _bundle_inside_roots(self) -> Settings:
        """A start-up bundle outside ``bundle_roots`` stops the server before it starts."""
        if self.bundle_source is not None:
            check_bundle_source(self.bundle_source, self.allowed_roots, "ESP_BUNDLE")
        return self

    @property
    def allowed_roots(self) -> tuple[str, ...]:
        """``bundle_roots`` as a tuple (empty: no restriction)."""
        return parse_roots(self.bundle_roots)

    @property
    def bundle_source(self) -> Path | str | None:
        """What is served at start: the bundle URI, else the bundle directory."""
        return self.bundle_uri or self.bundle


@lru_cache
def get_settings() -> Settings:
    return Settings()
