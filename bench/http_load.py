"""Loopback HTTP load on the search service, with and without micro-batching; one JSON line.

For each mode (batching on, off) a real server (``esp serve``) is started on a free port; for
each concurrency level, that many async clients (service/client.py) send one-query vector
searches until ``--requests`` are answered or ``--seconds`` pass. Reported per level:
throughput (queries/s), p50 and p99 latency, failures, and the ratio to the raw engine
(in-process ``create_engine``, same backend/threads, no HTTP) at a batch size equal to the
concurrency, measured while no server runs. The client, the server and the engine share
this machine's cores, so the ratio is a lower bound for a dedicated server.

    python bench/http_load.py                      # synthetic bundle like the demo's (24,884 x 384)
    python bench/http_load.py --bundle artifacts/demo/bundle --concurrency 1,32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from service.client import AsyncESPClient
from service.engine import create_engine
from subspace.bundle import read_bundle, write_bundle
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

DEFAULT_DIMS = {"semantic": 256, "entity": 96, "intent": 32}


def synthetic_bundle(root: Path, docs: int, seed: int = 0) -> Path:
    layout = SubspaceLayout.from_dims(DEFAULT_DIMS)
    rng = np.random.default_rng(seed)
    emb = normalize_blocks(rng.standard_normal((docs, layout.dim), dtype=np.float32), layout)
    return write_bundle(root / "bundle", layout, emb, [f"doc{i}" for i in range(docs)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    bundle: Path, args: argparse.Namespace, batching: bool, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESP_")}
    env.update(
        {
            "ESP_BACKEND": args.backend,
            "ESP_MAX_WAIT_MS": str(args.max_wait_ms),
            "ESP_MAX_BATCH": str(args.max_batch),
            "ESP_QUEUE_SIZE": "4096",
        }
    )
    if args.threads:
        env["ESP_THREADS"] = str(args.threads)
    cmd = [
        sys.executable,
        "-m",
        "subspace.cli",
        "serve",
        "--bundle",
        str(bundle),
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    if not batching:
        cmd.append("--no-batching")
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server not ready in 300 s")


async def load_level(
    url: str, queries: np.ndarray, *, concurrency: int, requests: int, seconds: float, k: int
) -> dict[str, Any]:
    latencies: list[float] = []
    failures = 0
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker(c: AsyncESPClient, w: int) -> None:
        nonlocal failures, sent
        i = w
        while sent < requests and time.perf_counter() < deadline:
            sent += 1
            t0 = time.perf_counter()
            try:
                await c.search([queries[i % len(queries)]], k=k)
                latencies.append(time.perf_counter() - t0)
            except Exception:
                failures += 1
            i += concurrency

    async with AsyncESPClient(url, timeout=120, max_connections=concurrency) as c:
        await asyncio.gather(*(c.search([queries[w]], k=k) for w in range(min(concurrency, 8))))  # warm
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c, w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "failures": failures,
        "qps": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
    }


def batch_totals(url: str) -> tuple[float, float]:
    """``(queries, engine calls)`` so far, from the server's esp_batch_size histogram."""
    values = {"esp_batch_size_sum": 0.0, "esp_batch_size_count": 0.0}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values["esp_batch_size_sum"], values["esp_batch_size_count"]


def engine_qps(bundle: Path, args: argparse.Namespace, queries: np.ndarray, batch: int) -> float:
    b = read_bundle(bundle, verify_checksums=False)
    engine = create_engine(args.backend, b.embeddings, b.layout, threads=args.threads)
    w = b.layout.default_weights()
    q = queries[:batch]
    engine.search(q, w, args.k)
    calls, t0 = 0, time.perf_counter()
    while calls < 3 or (time.perf_counter() - t0 < args.engine_seconds and calls < 2000):
        engine.search(q, w, args.k)
        calls += 1
    return batch * calls / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, help="bundle to serve (default: a synthetic one)")
    p.add_argument("--docs", type=int, default=24884, help="synthetic corpus size")
    p.add_argument("--concurrency", default="1,8,32,128")
    p.add_argument("--requests", type=int, default=2000, help="max requests per level")
    p.add_argument("--seconds", type=float, default=8.0, help="max seconds per level")
    p.add_argument("--engine-seconds", type=float, default=2.0)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--modes", default="batching,no_batching")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    with tempfile.TemporaryDirectory(prefix="esp-http-load-") as tmp:
        bundle = args.bundle or synthetic_bundle(Path(tmp), args.docs)
        layout = read_bundle(bundle, verify_checksums=False).layout
        rng = np.random.default_rng(1)
        queries = normalize_blocks(
            rng.standard_normal((max(levels) * 4, layout.dim), dtype=np.float32), layout
        )
        raw = {c: round(engine_qps(bundle, args, queries, c), 1) for c in levels}
        results: list[dict[str, Any]] = []
        for mode in args.modes.split(","):
            proc, url = start_server(bundle, args, mode == "batching", Path(tmp) / f"{mode}.log")
            try:
                for c in levels:
                    before = batch_totals(url)
                    r = asyncio.run(
                        load_level(
                            url,
                            queries,
                            concurrency=c,
                            requests=args.requests,
                            seconds=args.seconds,
                            k=args.k,
                        )
                    )
                    after = batch_totals(url)
                    calls = after[1] - before[1]
                    r.update(
                        mode=mode,
                        mean_batch=round((after[0] - before[0]) / calls, 2) if calls else None,
                        engine_qps_at_batch=raw[c],
                        ratio=round(r["qps"] / raw[c], 3),
                    )
                    results.append(r)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        n_docs = len(read_bundle(bundle, verify_checksums=False).ids)
    print(
        json.dumps(
            {
                "bench": "http_load",
                "docs": n_docs,
                "dim": layout.dim,
                "k": args.k,
                "backend": args.backend,
                "threads": args.threads,
                "cpus": os.cpu_count(),
                "max_batch": args.max_batch,
                "max_wait_ms": args.max_wait_ms,
                "engine_qps": raw,
                "levels": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
