"""Loopback HTTP load on the search service, with and without micro-batching; one JSON line.

For each mode (batching on, off) a real server (``esp serve``) is started on a free port; for
each client and concurrency level, that many closed-loop workers send one-query vector
searches until ``--requests`` are answered or ``--seconds`` pass. Reported per level:
throughput (queries/s), p50 and p99 latency, failures, the mean micro-batch, the server
process's CPU per request (all threads, and its event-loop thread alone), and the ratio to
the raw engine (in-process ``create_engine``, same backend/threads, no HTTP) at a batch size
equal to the concurrency, measured while no server runs. The client, the server and the
engine share this machine's cores, so the ratio is a lower bound for a dedicated server.

Clients: ``raw`` (default), the lean load generator of this bench, sends bodies encoded before
the clock starts over one keep-alive connection per worker, so nearly all the CPU goes to the
server: it measures the server. ``httpx`` is the SDK (esp_retrieval.client) as a caller uses it, on
httpx's default transport and pool; its own CPU competes with the server for the cores, so it
measures what a Python caller on the same machine sees. Each level reports the client process's
CPU per request (``client_cpu_ms_per_request``); README quotes measured figures.

With ``--docs`` a list (``--docs 24884,250000,1000000``) the whole measurement runs once per
synthetic corpus size, each in ``corpora``: the HTTP cost per request is fixed while the
engine's work per query grows with the corpus, so the ratio climbs with it; ``crossover``
reports the ratio per size at the goal concurrency and where it first reaches the goal
(log-linear between the two sizes around it, an estimate from these sizes only).

With ``--against DIR`` (another checkout of this repository, e.g. a worktree of an earlier
commit) each corpus also gets ``against``: this checkout's server and DIR's, alternating for
``--rounds`` rounds at the goal concurrency (batching, raw client), each round a fresh server of
each, and the ratio per round and its median: what a change costs, measured in one run.

    python bench/http_load.py                      # synthetic bundle, the demo's 24,884 docs x 384 dims
    python bench/http_load.py --docs 24884,250000,1000000 --concurrency 1,32 --modes batching
    python bench/http_load.py --bundle artifacts/demo/bundle --concurrency 1,32 --clients raw,httpx
    git worktree add ../esp-old <commit>           # an earlier checkout, then, in the same run:
    python bench/http_load.py --bundle B --modes batching --concurrency 32 --against ../esp-old
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import live_server
from bench._common import median
from bench.live_server import LiveServer
from esp_retrieval.client.client import AsyncESPClient, search_json
from esp_retrieval.service.engine import create_engine
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

DEFAULT_DIMS = {"semantic": 256, "entity": 96, "intent": 32}
CLIENTS = ("raw", "httpx")  # load clients (see the module docstring)


def synthetic_bundle(root: Path, docs: int, seed: int = 0, chunk: int = 100_000, groups: int = 0) -> Path:
    """A random block-normalised ``docs x 384`` bundle; drawn in chunks, so 1M rows need ~1.5 GB.
    ``groups``: each document gets a filterable string field ``group`` (``g0`` ..), one of that many."""
    layout = SubspaceLayout.from_dims(DEFAULT_DIMS)
    rng = np.random.default_rng(seed)
    emb = np.empty((docs, layout.dim), dtype=np.float32)
    for start in range(0, docs, chunk):
        stop = min(docs, start + chunk)
        emb[start:stop] = normalize_blocks(
            rng.standard_normal((stop - start, layout.dim), dtype=np.float32), layout
        )
    meta = [{"group": f"g{i % groups}"} for i in range(docs)] if groups else None
    return write_bundle(root / "bundle", layout, emb, [f"doc{i}" for i in range(docs)], docs=meta)


_NOOP_BODY = b'{"results":[{"hits":[]}]}'


async def noop_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ceiling: a bare ASGI app that reads the body and answers a constant (``--ceiling``)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_NOOP_BODY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _NOOP_BODY})


def noop_fastapi() -> FastAPI:
    """The ceiling with FastAPI: one POST route that reads the body and answers a constant."""
    app = FastAPI()

    @app.post("/v1/search")
    async def search(request: Request) -> Response:
        await request.body()
        return Response(_NOOP_BODY, media_type="application/json")

    return app


async def noop_level(url: str, body: bytes, concurrency: int, seconds: float) -> float:
    """Requests/s of ``concurrency`` raw connections against a no-op server."""
    split = urlsplit(url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    request = RawConnection.request_bytes(host, port, "/v1/search", body)
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        async with RawConnection(host, port) as conn:
            while time.perf_counter() < stop:
                status, _ = await conn.send(request)
                if status != 200:
                    raise RuntimeError(f"no-op server answered {status}")
                done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0)


def ceiling(queries: np.ndarray, args: argparse.Namespace, concurrency: int, log: Path) -> dict[str, float]:
    """Requests/s of no-op servers (uvicorn, same options as ``esp serve``) under the raw client."""
    body = json.dumps(search_json([queries[0]], k=args.k)).encode()
    out = {}
    targets = {"bare_asgi": "bench.http_load:noop_asgi", "fastapi": "bench.http_load:noop_fastapi"}
    for name, target in targets.items():
        port = live_server.free_port()
        cmd = [sys.executable, "-m", "uvicorn", target, "--port", str(port), "--log-level", "warning"]
        cmd += ["--no-access-log", *(["--factory"] if name == "fastapi" else [])]
        url = f"http://127.0.0.1:{port}"

        def answers(u: str = url) -> bool:
            return httpx.post(f"{u}/v1/search", content=body, timeout=2).status_code == 200

        with live_server.spawn(name, cmd, log, url, env=live_server.child_env()) as proc:
            proc.wait_until(answers, 60, "POST /v1/search == 200", interval=0.2)
            out[name] = round(asyncio.run(noop_level(url, body, concurrency, args.seconds)), 1)
    return out


def start_server(
    bundle: Path, args: argparse.Namespace, batching: bool, log: Path, pythonpath: Path | None = None
) -> LiveServer:
    """``esp serve`` with this run's backend and batching options, quiet (no access log).

    Admission is out of reach (a latency objective of an hour, an in-flight limit of the whole
    queue): this bench measures how much the server answers, so its closed-loop callers must
    not be refused; what admission refuses under overload is ``bench/soak.py``'s measurement.
    """
    settings = {
        "backend": args.backend,
        "threads": args.threads or None,
        "max_wait_ms": args.max_wait_ms,
        "max_batch": args.max_batch,
        "queue_size": 4096,
        "latency_budget_ms": 3_600_000,
        "max_inflight_searches": 4096,
    }
    flags = ["--log-level", "warning", "--no-access-log", *([] if batching else ["--no-batching"])]
    return live_server.start_server(
        bundle, log, settings=settings, args=flags, ready_timeout=300, pythonpath=pythonpath
    )


class RawConnection:
    """One keep-alive HTTP/1.1 connection on asyncio streams, for measuring the *server*.

    The request bodies are encoded once, before the clock starts, and a response is checked
    (status 200, one result of ``k`` hits) with one ``json.loads``: far less client CPU per
    request than a general HTTP client with its connection pool, so the cores go to the server.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawConnection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    @staticmethod
    def request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Send a prepared request; ``(status, body)``. The server must send Content-Length."""
        if self._reader is None or self._writer is None:
            raise RuntimeError("open the connection with `async with` first")
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length is None:
            raise RuntimeError("response without Content-Length")
        return status, await self._reader.readexactly(length)


def check_search(status: int, body: bytes, k: int, n: int = 1) -> None:
    """A search answer must be 200 with ``n`` results of ``k`` hits each."""
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
    results = json.loads(body)["results"]
    if len(results) != n or any(len(r["hits"]) != k for r in results):
        raise RuntimeError(f"unexpected result shape: {body[:200]!r}")


async def load_level(
    url: str,
    queries: np.ndarray,
    *,
    concurrency: int,
    requests: int,
    seconds: float,
    k: int,
    client: str = "raw",
    per_request: int = 1,
) -> dict[str, Any]:
    """``concurrency`` closed-loop workers, each one request in flight; latency per request.

    ``client="raw"``: one :class:`RawConnection` per worker, bodies pre-encoded (measures the
    server); ``"httpx"``: the SDK's :class:`AsyncESPClient` on httpx's default transport (what a
    Python caller sees). ``client_cpu_ms_per_request``: this process's CPU over the requests.
    """
    latencies: list[float] = []
    failures = 0
    sent = 0
    deadline = 0.0
    split = urlsplit(url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    raw = client == "raw"
    groups = [queries[(i + np.arange(per_request)) % len(queries)] for i in range(len(queries))]
    prepared = [
        RawConnection.request_bytes(host, port, "/v1/search", json.dumps(search_json(g, k=k)).encode())
        for g in groups
    ]

    async def send_one(conn: RawConnection | AsyncESPClient, i: int) -> None:
        if isinstance(conn, RawConnection):
            check_search(*await conn.send(prepared[i % len(prepared)]), k, per_request)
        else:
            res = await conn.search(groups[i % len(groups)], k=k)
            if len(res.results) != per_request or any(len(r.hits) != k for r in res.results):
                raise RuntimeError("unexpected result shape")

    async def worker(w: int, shared: AsyncESPClient, warmed: asyncio.Semaphore, go: asyncio.Event) -> None:
        nonlocal failures, sent
        async with contextlib.AsyncExitStack() as stack:
            conn = await stack.enter_async_context(RawConnection(host, port)) if raw else shared
            try:
                await send_one(conn, w)  # warm: connection open, first request answered
            finally:
                warmed.release()
            await go.wait()
            i = w
            while sent < requests and time.perf_counter() < deadline:
                sent += 1
                t0 = time.perf_counter()
                try:
                    await send_one(conn, i)
                    latencies.append(time.perf_counter() - t0)
                except Exception:
                    failures += 1
                    if raw:  # the connection's state is unknown: open a new one
                        await stack.aclose()
                        conn = await stack.enter_async_context(RawConnection(host, port))
                i += concurrency

    # retries=0: a 429 or 503 is counted as a failure of the server, not resent and hidden in a latency
    async with AsyncESPClient(url, timeout=120, max_connections=concurrency, retries=0) as shared:
        warmed, go = asyncio.Semaphore(0), asyncio.Event()
        tasks = [asyncio.create_task(worker(w, shared, warmed, go)) for w in range(concurrency)]
        for _ in range(concurrency):
            await warmed.acquire()
        deadline = time.perf_counter() + seconds
        t0, c0 = time.perf_counter(), time.process_time()
        go.set()
        await asyncio.gather(*tasks)
        elapsed, client_cpu = time.perf_counter() - t0, time.process_time() - c0
    lat = np.array(latencies) * 1000
    return {
        "concurrency": concurrency,
        "client": client,
        "requests": len(latencies),
        "failures": failures,
        "queries_per_request": per_request,
        "qps": round(per_request * len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
        "client_cpu_ms_per_request": round(1000 * client_cpu / max(1, len(latencies) + failures), 3),
    }


def process_cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (all threads), or of its thread ``thread``
    only (the main thread's id is ``pid``), from /proc; -1 where there is none."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_totals(url: str) -> tuple[float, float]:
    """``(queries, engine calls)`` so far, from the server's esp_batch_size histogram."""
    values = {"esp_batch_size_sum": 0.0, "esp_batch_size_count": 0.0}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values["esp_batch_size_sum"], values["esp_batch_size_count"]


def engine_qps(
    bundle: Path, args: argparse.Namespace, queries: np.ndarray, batch: int
) -> tuple[float, float]:
    """``(queries/s, CPU ms per query)`` of the in-process engine at ``batch`` queries per call."""
    b = read_bundle(bundle, verify_checksums=False)
    engine = create_engine(args.backend, b.embeddings, b.layout, threads=args.threads)
    w = b.layout.default_weights()
    q = queries[:batch]
    engine.search(q, w, args.k)
    calls, t0, c0 = 0, time.perf_counter(), time.process_time()
    while calls < 3 or (time.perf_counter() - t0 < args.engine_seconds and calls < 2000):
        engine.search(q, w, args.k)
        calls += 1
    cpu_ms = 1000 * (time.process_time() - c0) / (batch * calls)
    return batch * calls / (time.perf_counter() - t0), cpu_ms


def measure_level(
    server: LiveServer, queries: np.ndarray, args: argparse.Namespace, client: str, concurrency: int
) -> dict[str, Any]:
    """One :func:`load_level` on ``server`` with its mean micro-batch and CPU per request."""
    url, pid = server.url, server.proc.pid
    before, cpu_before = batch_totals(url), process_cpu_seconds(pid)
    loop_before = process_cpu_seconds(pid, thread=pid)
    level = {"concurrency": concurrency, "requests": args.requests, "seconds": args.seconds, "k": args.k}
    r = asyncio.run(load_level(url, queries, client=client, per_request=args.queries_per_request, **level))
    after, cpu_after = batch_totals(url), process_cpu_seconds(pid)
    loop_after = process_cpu_seconds(pid, thread=pid)
    calls = after[1] - before[1]
    served = max(1, r["requests"] + r["failures"])
    r.update(
        mean_batch=round((after[0] - before[0]) / calls, 2) if calls else None,
        server_cpu_ms_per_request=(
            round(1000 * (cpu_after - cpu_before) / served, 3) if cpu_after >= 0 else None
        ),
        # The event loop's share (HTTP, parsing, validation, responses; the engine runs
        # on other threads): the fixed cost per request the ratio is fighting.
        server_loop_cpu_ms_per_request=(
            round(1000 * (loop_after - loop_before) / served, 3) if loop_after >= 0 else None
        ),
    )
    return r


def compare_trees(
    bundle: Path, args: argparse.Namespace, queries: np.ndarray, concurrency: int, tmp: Path
) -> dict[str, Any]:
    """This checkout's server against the one of the checkout ``args.against`` (its code first on
    the server's ``PYTHONPATH``), same bundle, batching on, raw client, ``args.rounds`` rounds of
    one level each, the two alternating and each a fresh server: a change's cost in the same run.
    Settings the other checkout does not know are ignored by it."""
    rounds = []
    for i in range(args.rounds):
        level: dict[str, dict[str, Any]] = {}
        for name, path in (("this", None), ("other", args.against)):
            with start_server(bundle, args, True, tmp / f"{name}-{i}.log", pythonpath=path) as server:
                level[name] = measure_level(server, queries, args, "raw", concurrency)
        this, other = level["this"], level["other"]
        rounds.append({
            "this_qps": this["qps"],
            "other_qps": other["qps"],
            "ratio": round(this["qps"] / other["qps"], 3),
            "this_loop_cpu_ms_per_request": this["server_loop_cpu_ms_per_request"],
            "other_loop_cpu_ms_per_request": other["server_loop_cpu_ms_per_request"],
        })
    return {
        "other": str(args.against),
        "concurrency": concurrency,
        "client": "raw",
        "rounds": rounds,
        "ratio_median": round(median([r["ratio"] for r in rounds]), 3),
    }


def measure_corpus(bundle: Path, args: argparse.Namespace, levels: list[int], tmp: Path) -> dict[str, Any]:
    """Engine q/s at each level's batch, then every mode x client x level over HTTP, on one bundle."""
    b = read_bundle(bundle, verify_checksums=False)
    layout, n_docs = b.layout, len(b.ids)
    del b
    rng = np.random.default_rng(1)
    n_queries = max(levels) * max(4, args.queries_per_request)
    queries = normalize_blocks(rng.standard_normal((n_queries, layout.dim), dtype=np.float32), layout)
    # The raw engine at the batch a full micro-batch would hold: concurrency x queries per request.
    batch_of = {c: c * args.queries_per_request for c in levels}
    eng_before = {c: engine_qps(bundle, args, queries, batch_of[c]) for c in levels}
    results: list[dict[str, Any]] = []
    for mode in args.modes.split(","):
        with start_server(bundle, args, mode == "batching", tmp / f"{mode}.log") as server:
            for client, c in itertools.product(args.clients.split(","), levels):
                results.append({**measure_level(server, queries, args, client, c), "mode": mode})
    # Measured again after the servers: on a shared machine the engine's share of the cores
    # drifts; the ratio uses the mean of both and both are reported.
    eng_after = {c: engine_qps(bundle, args, queries, batch_of[c]) for c in levels}
    raw = {c: round((eng_before[c][0] + eng_after[c][0]) / 2, 1) for c in levels}
    engine_cpu = {c: round(min(eng_before[c][1], eng_after[c][1]), 3) for c in levels}
    for r in results:
        c = r["concurrency"]
        r.update(engine_qps_at_batch=raw[c], ratio=round(r["qps"] / raw[c], 3))
        # CPU-bound view, robust to other load: the engine's CPU per query over the CPU
        # per query of the whole loop (server process, engine included, plus the client).
        if r["server_cpu_ms_per_request"] is not None:
            per_query = r["server_cpu_ms_per_request"] + r["client_cpu_ms_per_request"]
            total = per_query / args.queries_per_request
            r["cpu_ratio"] = round(engine_cpu[c] / total, 3)
    return {
        "docs": n_docs,
        "dim": layout.dim,
        "engine_qps": raw,
        "engine_qps_before": {c: round(eng_before[c][0], 1) for c in levels},
        "engine_qps_after": {c: round(eng_after[c][0], 1) for c in levels},
        "engine_cpu_ms_per_query": engine_cpu,
        "engine_batch": batch_of,
        "levels": results,
        "noop_ceiling_rps": (ceiling(queries, args, max(levels), tmp / "noop.log") if args.ceiling else None),
        "against": (
            compare_trees(bundle, args, queries, goal_concurrency(args, levels), tmp)
            if args.against is not None
            else None
        ),
    }


def crossover(
    corpora: list[dict[str, Any]], concurrency: int, goal: float, mode: str = "batching", client: str = "raw"
) -> dict[str, Any]:
    """Ratio (and CPU ratio) per corpus size at ``concurrency``; the first size reaching ``goal``.

    ``docs_estimate``: where the ratio crosses ``goal``, interpolated linearly in log(docs)
    between the last size below and the first at or above it; None when no measured size
    reaches it, the smallest size when all do.
    """
    points = []
    for corpus in sorted(corpora, key=lambda c: c["docs"]):
        for r in corpus["levels"]:
            if r["concurrency"] == concurrency and r["mode"] == mode and r["client"] == client:
                points.append({"docs": corpus["docs"], "ratio": r["ratio"], "cpu_ratio": r.get("cpu_ratio")})
    estimate: float | None = None
    for i, p in enumerate(points):
        if p["ratio"] >= goal:
            if i == 0:
                estimate = float(p["docs"])
            else:
                lo = points[i - 1]
                t = (goal - lo["ratio"]) / (p["ratio"] - lo["ratio"])
                estimate = float(np.exp(np.log(lo["docs"]) + t * (np.log(p["docs"]) - np.log(lo["docs"]))))
            break
    return {
        "goal_ratio": goal,
        "concurrency": concurrency,
        "mode": mode,
        "client": client,
        "by_docs": points,
        "docs_estimate": None if estimate is None else round(estimate),
    }


def goal_concurrency(args: argparse.Namespace, levels: list[int]) -> int:
    """``--goal-concurrency`` when it is one of the levels, else the top level."""
    return int(args.goal_concurrency if args.goal_concurrency in levels else max(levels))


def int_list(text: str) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``; every value a positive integer."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, help="bundle to serve (default: synthetic ones, --docs)")
    p.add_argument(
        "--docs",
        type=int_list,
        default=[24884],
        help="synthetic corpus size(s), comma-separated: one full measurement per size (default: the demo's)",
    )
    p.add_argument("--concurrency", type=int_list, default=[1, 8, 32, 128])
    p.add_argument("--requests", type=int, default=2000, help="max requests per level")
    p.add_argument("--seconds", type=float, default=8.0, help="max seconds per level")
    p.add_argument("--engine-seconds", type=float, default=2.0)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--modes", default="batching,no_batching")
    p.add_argument("--goal-ratio", type=float, default=0.7, help="the crossover's target ratio")
    p.add_argument(
        "--goal-concurrency",
        type=int,
        default=32,
        help="the concurrency the crossover is read at (default 32; the top level if 32 is not run)",
    )
    p.add_argument(
        "--queries-per-request",
        type=int,
        default=1,
        help="queries in each request (the API takes up to max_queries): HTTP cost per query falls",
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also measure no-op servers (bare ASGI, one-route FastAPI) at the top concurrency",
    )
    p.add_argument(
        "--clients",
        default="raw",
        help="load clients, comma-separated: raw (prepared bodies on asyncio streams: the server's "
        "cost) and/or httpx (the SDK, esp_retrieval.client, on httpx's default transport: what a Python "
        "caller sees, its own CPU included)",
    )
    p.add_argument(
        "--against",
        type=Path,
        help="another checkout of this repository (e.g. a git worktree of an earlier commit): its "
        "server is measured against this one's at the goal concurrency, alternating, in each corpus",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of --against (default 3)")
    args = p.parse_args(argv)
    levels: list[int] = args.concurrency
    if args.against is not None and not any((args.against / d).is_dir() for d in live_server.CLI_MODULES):
        p.error(f"--against: {args.against} is not a checkout of this repository (no esp_retrieval/)")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    unknown = set(args.clients.split(",")) - set(CLIENTS)
    if unknown:
        p.error(f"--clients: unknown {sorted(unknown)}; choose from {', '.join(CLIENTS)}")
    if args.bundle is not None and p.get_default("docs") != args.docs:
        p.error("--docs sizes synthetic corpora; it cannot be combined with --bundle")

    corpora: list[dict[str, Any]] = []
    for docs in [None] if args.bundle is not None else args.docs:
        with tempfile.TemporaryDirectory(prefix="esp-http-load-") as tmp:
            bundle = args.bundle if docs is None else synthetic_bundle(Path(tmp), docs)
            corpora.append(measure_corpus(bundle, args, levels, Path(tmp)))
    goal_c = goal_concurrency(args, levels)
    first = corpora[0]
    print(
        json.dumps(
            {
                "bench": "http_load",
                "docs": [c["docs"] for c in corpora],
                "dim": first["dim"],
                "k": args.k,
                "backend": args.backend,
                "threads": args.threads,
                "cpus": os.cpu_count(),
                "max_batch": args.max_batch,
                "max_wait_ms": args.max_wait_ms,
                "queries_per_request": args.queries_per_request,
                "crossover": crossover(corpora, goal_c, args.goal_ratio, client=args.clients.split(",")[0]),
                "corpora": corpora,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
