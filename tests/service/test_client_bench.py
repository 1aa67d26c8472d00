"""bench/http_load.py's httpx clients: the service client on its lean and on httpx's default transport."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.http_load import load_level, main
from bench.live_server import LiveServer
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks


def test_httpx_default_client_serves_every_request(served: LiveServer, served_layout: SubspaceLayout) -> None:
    rng = np.random.default_rng(0)
    queries = normalize_blocks(rng.standard_normal((4, served_layout.dim)).astype(np.float32), served_layout)
    r = asyncio.run(
        load_level(served.url, queries, concurrency=3, requests=9, seconds=30, k=5, client="httpx_default")
    )
    assert (r["failures"], r["requests"], r["client"]) == (0, 9, "httpx_default")


def test_unknown_client_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--clients", "raw,curl"])
    err = capsys.readouterr().err
    assert "unknown ['curl']" in err and "raw, httpx, httpx_default" in err
