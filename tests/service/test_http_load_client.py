"""bench/http_load.py's load clients against the real server: both answer, and fail loudly."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from bench.http_load import RawConnection, check_search, load_level
from bench.live_server import LiveServer
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks


@pytest.mark.parametrize(("client", "per_request"), [("raw", 1), ("raw", 3), ("httpx", 1), ("httpx", 2)])
def test_load_level_serves_every_request(
    served: LiveServer, served_layout: SubspaceLayout, client: str, per_request: int
) -> None:
    rng = np.random.default_rng(0)
    queries = normalize_blocks(rng.standard_normal((8, served_layout.dim)).astype(np.float32), served_layout)
    r = asyncio.run(
        load_level(
            served.url, queries, concurrency=3, requests=12, seconds=30, k=5, client=client, per_request=per_request
        )
    )
    assert r["failures"] == 0
    assert r["requests"] == 12
    assert r["client"] == client
    assert r["queries_per_request"] == per_request


def test_raw_connection_returns_status_and_body(served: LiveServer, served_layout: SubspaceLayout) -> None:
    host, port = served.url.removeprefix("http://").split(":")

    async def two() -> list[tuple[int, bytes]]:
        async with RawConnection(host, int(port)) as conn:
            good = json.dumps({"queries": [{"vector": [1.0] * served_layout.dim}], "k": 4}).encode()
            bad = json.dumps({"queries": [{"vector": [1.0]}], "k": 4}).encode()
            return [
                await conn.send(RawConnection.request_bytes(host, int(port), "/v1/search", body))
                for body in (good, bad)
            ]

    (s1, b1), (s2, b2) = asyncio.run(two())
    check_search(s1, b1, 4)
    assert s2 == 422
    with pytest.raises(RuntimeError, match="HTTP 422"):
        check_search(s2, b2, 4)
    with pytest.raises(RuntimeError, match="result shape"):
        check_search(s1, b1, 5)
    with pytest.raises(RuntimeError, match="result shape"):
        check_search(s1, b1, 4, n=2)
