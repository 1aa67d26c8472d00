"""The Python SDK of the ESP search service: typed sync and async clients over httpx.

It imports nothing of the server (``service/``; its answer models are :mod:`esp_retrieval.client.models`),
so callers install it without torch or FastAPI::

    from esp_retrieval.client import ESPClient
    with ESPClient("http://127.0.0.1:8000") as esp:
        esp.search([{"text": "who is robert gray"}], k=5, weights={"entity": 1.0})
"""

from esp_retrieval.client.client import AsyncESPClient, ESPClient, ESPError
from esp_retrieval.client.models import (
    Assignment,
    ClusterResponse,
    DeleteResponse,
    EmbeddingsResponse,
    Experiments,
    Health,
    Hit,
    LayoutResponse,
    OperatingPoints,
    Readiness,
    ReloadResponse,
    SearchResponse,
    UpsertResponse,
)

__all__ = [
    "Assignment",
    "AsyncESPClient",
    "ClusterResponse",
    "DeleteResponse",
    "ESPClient",
    "ESPError",
    "EmbeddingsResponse",
    "Experiments",
    "Health",
    "Hit",
    "LayoutResponse",
    "OperatingPoints",
    "Readiness",
    "ReloadResponse",
    "SearchResponse",
    "UpsertResponse",
]
