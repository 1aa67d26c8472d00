"""Hot reloads do not leak: threads, open files, memory maps and RSS stay flat over many reloads.

Before the fix every reload kept the old engine alive (its worker pool's threads held a bound
method of it), with its threads, its mapping of ``embeddings.npy`` and its memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.client.client import ESPClient
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.scoring import normalize_blocks

ROWS = 60_000
WARM_RELOADS = 3
RELOADS = 10
QUERIES: list[Any] = [[1.0] * 32, "a text query"]  # a vector and a text query


def _big_bundle(src: Path, out: Path, seed: int) -> Path:
    b = read_bundle(src)
    rng = np.random.default_rng(seed)
    emb = normalize_blocks(rng.standard_normal((ROWS, b.layout.dim)).astype(np.float32), b.layout)
    return write_bundle(out, b.layout, emb, [f"doc-{i}" for i in range(ROWS)], encoder_dir=b.encoder_dir)


def process_stats(pid: int) -> dict[str, int]:
    """Threads, RSS (kB), open file descriptors and mappings of an ``embeddings.npy`` of ``pid``."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {
        "threads": int(status["Threads"]),
        "rss_kb": int(status["VmRSS"].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "index_maps": sum("embeddings.npy" in line for line in maps),
    }


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.slow
def test_many_reloads_leave_threads_files_maps_and_rss_flat(
    tiny_bundle: Path, tmp_path: Path, server_factory: Callable[..., LiveServer]
) -> None:
    bundles = [_big_bundle(tiny_bundle, tmp_path / f"b{i}", seed=i) for i in range(2)]
    server = server_factory(bundles[0], token="leak-test-token", threads=2)
    pid = server.proc.pid
    with ESPClient(server.url, admin_token=server.token, timeout=120) as c:

        def reload(i: int) -> None:
            c.reload(str(bundles[i % 2]))
            for _ in range(3):  # the new engine scans with its worker pool, the encoder encodes
                assert len(c.search(QUERIES, k=5).results) == 2

        for i in range(WARM_RELOADS):
            reload(i)
        before = process_stats(pid)
        for i in range(RELOADS):
            reload(WARM_RELOADS + i)
        after = process_stats(pid)
    assert after["threads"] <= before["threads"], (before, after)
    assert after["fds"] <= before["fds"] + 2, (before, after)
    assert after["index_maps"] == 0, "the index is served from a private copy, not a shared mapping"
    assert after["rss_kb"] <= before["rss_kb"] * 1.10, (before, after)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.slow
def test_overlapping_blocking_work_starts_no_thread(
    tiny_bundle: Path, server_factory: Callable[..., LiveServer]
) -> None:
    """Reloads and encodes overlap: the loop's blocking pool has all its threads once the server
    is ready, and encodes run on the bundle's one encoder thread, so the count does not creep up
    with the most calls that ever overlapped. Before: asyncio's lazily grown pool (8 -> 9
    threads in a soak), and an OpenMP team for every pool thread that ever encoded (+5 here)."""
    server = server_factory(tiny_bundle, token="threads-test-token", threads=2)
    pid = server.proc.pid
    with ESPClient(server.url, admin_token=server.token, timeout=120) as c:
        c.search(QUERIES, k=5)
        before = process_stats(pid)["threads"]

        def work(i: int) -> None:
            if i % 4 == 0:
                c.reload(str(tiny_bundle))
            else:
                c.embeddings([f"text {i} {j}" for j in range(32)])

        with ThreadPoolExecutor(max_workers=12) as pool:
            list(pool.map(work, range(24)))
    deadline = time.monotonic() + 5.0  # a replaced bundle's encoder thread ends just after its last encode
    while (after := process_stats(pid)["threads"]) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert after == before, (before, after)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_reloads_of_a_vector_bundle_leave_rss_flat_whatever_thread_is_free(
    tmp_path: Path, server_factory: Callable[..., LiveServer]
) -> None:
    """Every load runs on the one loader thread. On the shared pool for blocking work, each pool
    thread that ran a load kept what the load left with it (its malloc arena), and RSS rose by a
    step per reload (~25 MB for this 24,884 x 384 bundle) until each of the six had loaded once:
    +44% over ten reloads."""
    from bench.http_load import synthetic_bundle

    bundles = [synthetic_bundle(tmp_path / f"s{i}", 24_884, seed=i) for i in range(2)]
    server = server_factory(bundles[0], token="rss-test-token", threads=1, blocking_threads=6)
    pid = server.proc.pid
    vector = [[0.1] * 384]
    with ESPClient(server.url, admin_token=server.token, timeout=120) as c:

        def reload(i: int) -> None:
            c.reload(str(bundles[i % 2]))
            for _ in range(3):
                assert len(c.search(vector, k=5).results) == 1

        for i in range(2):  # both bundles have been served once
            reload(i + 1)
        before = process_stats(pid)
        for i in range(RELOADS):
            reload(i + 1)
        after = process_stats(pid)
    assert after["threads"] <= before["threads"], (before, after)
    assert after["rss_kb"] <= before["rss_kb"] * 1.10, (before, after)
