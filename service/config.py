"""Service settings from the environment (prefix ``ESP_``), e.g. ``ESP_BUNDLE=/models/demo``.

Loaded once via :func:`get_settings` and injected with ``Depends`` so tests override them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.engine import BACKENDS, PRECISIONS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ESP_", extra="ignore")

    bundle: Path | None = Field(None, description="bundle directory to serve")
    registry: Path | None = Field(
        None, description="operating points / experiments file (YAML or JSON), re-read on change"
    )
    registry_poll_seconds: float = Field(2.0, gt=0, description="how often the registry is checked")
    admin_token: SecretStr | None = Field(
        None, description="bearer token for /v1/admin/*; admin routes are disabled without one"
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    backend: str = Field("auto", description=f"engine backend: {', '.join(['auto', *BACKENDS])}")
    precision: str = Field("float32", description=f"index precision: {', '.join(PRECISIONS)}")
    threads: int | None = Field(None, ge=1, description="engine threads (default: all cores)")
    max_queries: int = Field(256, ge=1, description="queries per request")
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


@lru_cache
def get_settings() -> Settings:
    return Settings()
