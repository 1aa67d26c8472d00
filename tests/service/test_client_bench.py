"""bench/http_load.py's clients: the SDK on httpx's default transport reports its own CPU; unknown
client names (the removed ``httpx_default`` among them) are refused with the choices."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.http_load import CLIENTS, load_level, main
from bench.live_server import LiveServer
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks


def test_httpx_client_serves_every_request_and_reports_its_cpu(
    served: LiveServer, served_layout: SubspaceLayout
) -> None:
    rng = np.random.default_rng(0)
    queries = normalize_blocks(rng.standard_normal((4, served_layout.dim)).astype(np.float32), served_layout)
    r = asyncio.run(
        load_level(served.url, queries, concurrency=3, requests=9, seconds=30, k=5, client="httpx")
    )
    assert (r["failures"], r["requests"], r["client"]) == (0, 9, "httpx")
    assert r["client_cpu_ms_per_request"] > 0  # the SDK's own work is counted, not hidden


@pytest.mark.parametrize("name", ["curl", "httpx_default"])
def test_unknown_client_is_refused_with_the_choices(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert {"raw", "httpx"} <= set(CLIENTS)
    with pytest.raises(SystemExit):
        main(["--clients", f"raw,{name}"])
    err = capsys.readouterr().err
    assert f"unknown [{name!r}]" in err and "choose from raw, httpx" in err
