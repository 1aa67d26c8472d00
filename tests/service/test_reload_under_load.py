"""Hot reload under concurrent load: nothing fails, every answer is the old or the new bundle."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.client.client import AsyncESPClient, ESPClient, ESPError
from esp_retrieval.subspace.bundle import read_bundle
from tests.live_fixtures import rebundle

CONCURRENCY = 12


async def _load(url: str, stop: asyncio.Event, worker: int, seen: Counter[str], failures: list[str]) -> None:
    rng = np.random.default_rng(worker)
    async with AsyncESPClient(url, timeout=60) as c:
        i = 0
        while not stop.is_set():
            query = "text query about rivers" if i % 4 == 0 else rng.standard_normal(32).tolist()
            try:
                res = await c.search([query], k=5, weights={"entity": float(rng.uniform(0.1, 2))})
                assert len(res.results[0].hits) == 5
                seen[res.bundle_version] += 1
            except Exception as exc:  # any failure is what this test is about
                failures.append(f"{type(exc).__name__}: {exc}")
            i += 1


async def _scenario(server: LiveServer, good: Path, bad: Path) -> tuple[Counter[str], list[str], dict]:
    seen: Counter[str] = Counter()
    failures: list[str] = []
    stop = asyncio.Event()
    workers = [asyncio.create_task(_load(server.url, stop, w, seen, failures)) for w in range(CONCURRENCY)]
    out: dict = {}

    async def wait_for(n: int) -> None:
        target, deadline = sum(seen.values()) + n, asyncio.get_running_loop().time() + 60
        while sum(seen.values()) < target and not failures and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async with AsyncESPClient(server.url, admin_token=server.token, timeout=120) as admin:
        await wait_for(40)
        out["good"] = await admin.reload(str(good))
        out["after_good"] = sum(seen.values())
        await wait_for(40)
        try:
            await admin.reload(str(bad))
        except ESPError as exc:
            out["bad"] = exc
        await wait_for(40)
        out["final"] = (await admin.ready()).bundle_version
    stop.set()
    await asyncio.gather(*workers)
    return seen, failures, out


@pytest.mark.slow
def test_reload_good_then_corrupt_under_load(served: LiveServer, tmp_path: Path) -> None:
    """Runs on the shared server (a second one costs a torch start-up) and restores its bundle."""
    good = rebundle(served.bundle, tmp_path / "good", seed=11)
    bad = rebundle(served.bundle, tmp_path / "bad", seed=12, corrupt=True)
    old_v, new_v = read_bundle(served.bundle).version, read_bundle(good).version
    assert old_v != new_v
    try:
        seen, failures, out = asyncio.run(_scenario(served, good, bad))
    finally:
        with ESPClient(served.url, admin_token=served.token, timeout=120) as admin:
            assert admin.reload(str(served.bundle)).bundle_version == old_v

    assert failures == []
    assert set(seen) <= {old_v, new_v}
    assert seen[old_v] > 0 and seen[new_v] > 0
    assert out["good"].bundle_version == new_v and out["good"].previous_version == old_v
    assert isinstance(out.get("bad"), ESPError)
    assert out["bad"].status == 409 and "sha256 mismatch" in out["bad"].message
    assert out["final"] == new_v
    assert served.token is not None and served.token not in served.log()
