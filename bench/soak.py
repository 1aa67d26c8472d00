"""Soak: a bounded run at twice the measured peak, with hot reloads and registry changes; one JSON line.

A real server (``esp serve``, admin token, registry file) serves a synthetic bundle (or
``--bundle``). The run, all on loopback with :class:`bench.http_load.RawConnection` clients:

1. **calibration**: a server with the admission defaults (same bundle and settings), started and
   stopped first: its unloaded p99 (one closed-loop caller, one-query vector searches) and its
   **peak**, ``--peak-concurrency`` closed-loop callers for ``--peak-seconds``: answered/s (its
   capacity; measured where the latency objective does not refuse the callers, which would
   retry at once and measure their own retry storm); and its **goodput peak**: the most answered/s
   of closed-loop callers (1, 2, 4, ... up to ``--peak-concurrency``, ``--goodput-seconds`` each)
   whose p99 is within the soak server's objective (below): the capacity *within* the objective,
   which the plain peak (reached with large batches, far past the objective) is not;
2. **the soak server**: its latency objective ``ESP_LATENCY_BUDGET_MS`` is ``--latency-budget-ms``
   when given, else ``--budget-over-unloaded`` (default 2) times the calibration's unloaded p99,
   the objective an operator sets from the latency served unloaded; **unloaded**: one
   closed-loop caller: p50 / p99 (the anchor the admitted latency is compared to);
3. **soak**: open-loop arrivals at ``--overload`` x the peak (``--overload-of peak``, default) or
   the goodput peak (``--overload-of goodput``) for ``--minutes``
   (default 10), every request on its own schedule (latency counted from when it was due, so
   client-side queueing is not hidden), while a hot reload alternates two bundles every
   ``--reload-every`` seconds (default 60) and the registry file's operating point changes every
   ``--registry-every`` seconds (default 120); beside it, the attacks (:func:`attack`): 64
   connections trickling a search body a byte every 5 s (``--slow-connections``), a search of 256
   queries every 2 s (``--expensive-*``), and one filtered by an ``in`` of 1,024 values every
   second (``--filter-every``, synthetic bundles: their field ``group``), each answered on its
   own connection and reported apart (``attacks``: statuses by attack; a 5xx, a transport error
   or a refusal without ``Retry-After`` is lost).

Reported: answered/s (200s) and as a share of both peaks, the 429 share, p50 / p99 of admitted
(200) requests against the unloaded p50 / p99 (ratios; the p99 also against the calibration's),
5xx count, *lost* requests (no answer, a transport error, any status other than 200 / 429 / 503,
or a 429 / 503 without ``Retry-After``), the server's RSS and thread count at the start and end of
the soak (and their ratio across the reloads), reloads and registry changes done; for the admitted
requests, the p99 of the client's own delay in sending them (from due to on the wire: scheduling
and the wait for a connection, inside their latency); the client's event-loop lag (p99) and CPU
share; the 429s by reason (from their message).

Everything runs on this machine's cores, so by default (``--pin``, with two cores or more) the
load client runs on the first core and the server (event loop, engine, reloads) on the others,
so neither steals the other's CPU and the client's own lag does not pass for the server's
(``--no-pin`` shares them all); the client runs on uvloop when installed (``--no-uvloop``:
asyncio's loop), a cheaper loop that leaves its core less busy. The numbers describe this
machine under this load, not a dedicated server.

    python bench/soak.py                    # 10 minutes
    python bench/soak.py --minutes 3        # shorter
    python bench/soak.py --quick            # a smoke run of about a minute (tests/bench)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import live_server
from bench._common import emit, machine, progress
from bench.http_load import DEFAULT_DIMS, RawConnection, synthetic_bundle
from bench.live_server import LiveServer
from esp_retrieval.client.client import search_json
from esp_retrieval.subspace.atomic import atomic_write_text
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

OP = "soak"  # the operating point every soak request uses (it changes under the run)


def registry_doc(names: list[str], step: int) -> dict[str, Any]:
    """The registry file at change ``step``: the soak operating point's weights move."""
    weights = dict.fromkeys(names, 1.0)
    weights[names[step % len(names)]] = 2.0 + step % 3
    return {"version": 1, "operating_points": {OP: {"weights": weights}}}


def pin(cpus: set[int]) -> None:
    """Every thread of this process (and the children it starts from now on) on ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)


def split_cores(enabled: bool) -> tuple[set[int], set[int]] | None:
    """``(client, server)`` cores: the first allowed core for the client, the rest for the
    server; None when not pinning (disabled, or fewer than two cores)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not enabled or len(cores) < 2:
        return None
    return {cores[0]}, set(cores[1:])


def admission_refusals(url: str) -> dict[str, int]:
    """The server's own count of the searches it refused, by reason
    (``esp_admission_refusals_total{reason}`` on its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        sample.labels["reason"]: int(sample.value)
        for family in text_string_to_metric_families(text) if family.name == "esp_admission_refusals"
        for sample in family.samples if sample.name == "esp_admission_refusals_total"
    }


def proc_stats(pid: int) -> dict[str, Any]:
    """RSS, thread count and the threads by their OS name, digits dropped (Python names its
    threads at the OS level only from 3.14, so before that they all read ``python``)."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    names: dict[str, int] = {}
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        with contextlib.suppress(OSError):  # a thread that ended while we looked
            name = comm.read_text().strip().rstrip("0123456789")
            names[name] = names.get(name, 0) + 1
    return {
        "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1),
        "threads": int(status["Threads"]),
        "thread_names": dict(sorted(names.items())),
    }


class Conns:
    """A bounded pool of keep-alive connections, as a client's connection pool or a load balancer
    has (``size``): a request due while all are busy waits for one, and that wait counts in its
    latency. One idle longer than ``max_idle`` is dropped, not reused: the server closes idle
    connections (its keep-alive timeout), and a request sent on one it is closing would be lost."""

    def __init__(self, host: str, port: int, size: int = 256, max_idle: float = 3.0) -> None:
        self.host, self.port = host, port
        self.max_idle = max_idle
        self.idle: list[tuple[float, RawConnection]] = []
        self.opened = 0
        self.slots = asyncio.Semaphore(size)

    async def get(self) -> RawConnection:
        await self.slots.acquire()
        try:
            return await self._get()
        except BaseException:
            self.slots.release()
            raise

    def drop(self, conn: RawConnection) -> None:
        """A connection that failed: closed, its slot freed."""
        self.slots.release()
        if conn._writer is not None:
            conn._writer.close()

    async def _get(self) -> RawConnection:
        now = time.monotonic()
        while self.idle:
            since, conn = self.idle.pop()
            if now - since <= self.max_idle:
                return conn
            await conn.__aexit__()
        conn = RawConnection(self.host, self.port)
        await conn.__aenter__()
        self.opened += 1
        return conn

    def put(self, conn: RawConnection) -> None:
        self.idle.append((time.monotonic(), conn))
        self.slots.release()

    async def close(self) -> None:
        for _, conn in self.idle:
            await conn.__aexit__()
        self.idle.clear()


async def send(conn: RawConnection, request: bytes, timeout: float) -> tuple[int, bytes, bool]:
    """``(status, body, has Retry-After)``; RawConnection.send keeps only the body, so the head is
    read here too."""
    if conn._writer is None or conn._reader is None:
        raise RuntimeError("connection not open")
    conn._writer.write(request)
    async with asyncio.timeout(timeout):  # one deadline, no task per read (asyncio.wait_for makes one)
        return await _read(conn._reader)


async def _read(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, retry_after = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "retry-after":
            retry_after = True
    return status, await reader.readexactly(length), retry_after


async def closed_loop(
    conns: Conns, requests: list[bytes], concurrency: int, seconds: float, timeout: float
) -> tuple[list[float], int]:
    """``concurrency`` callers, one request in flight each, for ``seconds``: 200 latencies, others."""
    latencies: list[float] = []
    other = 0
    deadline = time.perf_counter() + seconds

    async def caller(w: int) -> None:
        nonlocal other
        conn = await conns.get()
        i = w
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, _, _ = await send(conn, requests[i % len(requests)], timeout)
            if status == 200:
                latencies.append(time.perf_counter() - t0)
            else:
                other += 1
            i += concurrency
        conns.put(conn)

    await asyncio.gather(*(caller(w) for w in range(concurrency)))
    return latencies, other


async def goodput_levels(
    conns: Conns, requests: list[bytes], args: argparse.Namespace, objective_ms: float
) -> list[dict[str, Any]]:
    """Closed-loop callers 1, 2, 4, ... up to ``--peak-concurrency``, ``--goodput-seconds`` each:
    answered/s and p99 per level, and whether the p99 is within ``objective_ms``; stops at the
    first level past it (more callers only queue longer)."""
    levels: list[dict[str, Any]] = []
    concurrency = 1
    while concurrency <= args.peak_concurrency:
        lat, other = await closed_loop(conns, requests, concurrency, args.goodput_seconds, args.timeout)
        p99 = pct(lat, 99)
        within = p99 is not None and p99 <= objective_ms
        rate = round(len(lat) / args.goodput_seconds, 1)
        levels.append({"concurrency": concurrency, "answered_per_s": rate, "p99_ms": p99, "not_200": other,
                       "within_objective": within})
        if not within:
            break
        concurrency *= 2
    return levels


class Tally:
    def __init__(self) -> None:
        self.ok: list[float] = []
        self.ok_send_delay: list[float] = []  # of each admitted request: due -> sent (the client's delay)
        self.status: dict[int, int] = {}
        self.no_retry_after = 0
        self.lost = 0
        self.lost_reasons: dict[str, int] = {}

    def record(self, status: int | None, latency: float, retry_after: bool, reason: str = "") -> None:
        if status is None:
            self.lost += 1
            self.lost_reasons[reason] = self.lost_reasons.get(reason, 0) + 1
            return
        self.status[status] = self.status.get(status, 0) + 1
        if status == 200:
            self.ok.append(latency)
        elif status in (429, 503):
            if not retry_after:
                self.no_retry_after += 1
                self.lost += 1
        else:
            self.lost += 1
            key = f"status {status}"
            self.lost_reasons[key] = self.lost_reasons.get(key, 0) + 1


async def open_loop(
    conns: Conns, requests: list[bytes], rate: float, seconds: float, timeout: float
) -> Tally:
    """Requests due at ``rate``/s for ``seconds``, each sent on an idle connection when due."""
    tally = Tally()
    start = time.perf_counter()
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int, due: float) -> None:
        try:
            conn = await conns.get()
        except OSError as exc:
            tally.record(None, 0.0, False, f"connect: {type(exc).__name__}")
            return
        got = time.perf_counter()
        try:
            status, _, retry_after = await send(conn, requests[i % len(requests)], timeout)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            tally.record(None, 0.0, False, type(exc).__name__)
            conns.drop(conn)
            return
        tally.record(status, time.perf_counter() - due, retry_after)
        if status == 200:
            tally.ok_send_delay.append(max(0.0, got - due))
        conns.put(conn)

    i = 0
    while True:
        now = time.perf_counter()
        if now - start >= seconds:
            break
        due_count = int((now - start) * rate) + 1 - i  # request i is due at start + i / rate
        for _ in range(max(0, due_count)):
            task = asyncio.create_task(one(i, start + i / rate))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        await asyncio.sleep(0.001)
    if pending:
        await asyncio.gather(*pending)
    return tally


async def loop_lag(seconds: float, out: list[float], interval: float = 0.005) -> None:
    """How late this process's event loop wakes a sleeper due every ``interval`` s: the load
    client's own lag, which every latency it measures includes."""
    end = time.perf_counter() + seconds
    while (due := time.perf_counter() + interval) < end:
        await asyncio.sleep(interval)
        out.append(max(0.0, time.perf_counter() - due))


GROUPS = 2048  # distinct values of the synthetic bundles' filterable field ``group``


class Attacks:
    """What the attackers sent and got, by attack; ``lost``: a 5xx, a transport error, or a
    refusal without ``Retry-After`` (a slow connection's 408 and close are its expected end)."""

    def __init__(self) -> None:
        self.status: dict[str, dict[int, int]] = {}
        self.lost: dict[str, int] = {}

    def record(self, attack: str, status: int | None, retry_after: bool = True) -> None:
        if status is not None:
            by = self.status.setdefault(attack, {})
            by[status] = by.get(status, 0) + 1
        if status is None or status >= 500 or (status in (429, 503) and not retry_after):
            self.lost[attack] = self.lost.get(attack, 0) + 1


async def slow_connection(host: str, port: int, request: bytes, end: float, attacks: Attacks) -> None:
    """A connection that sends a search's headers, then its body one byte every 5 s, until the
    server answers (408 at ``ESP_SEARCH_BODY_DEADLINE_SECONDS``); then again, until ``end``."""
    head, _, body = request.partition(b"\r\n\r\n")
    while time.monotonic() < end:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            attacks.record("slow_connection", None)
            await asyncio.sleep(1.0)
            continue
        try:
            writer.write(head + b"\r\n\r\n")
            answer = b""
            for byte in body:
                writer.write(bytes([byte]))
                try:
                    answer = await asyncio.wait_for(reader.read(65536), 5.0)
                except TimeoutError:
                    if time.monotonic() >= end:
                        return
                    continue
                break
            status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else None
            attacks.record("slow_connection", status)
        except (OSError, asyncio.IncompleteReadError):
            attacks.record("slow_connection", None)
        finally:
            writer.close()


async def repeat(
    address: tuple[str, int], name: str, request: bytes, *, every: float, end: float, attacks: Attacks,
    timeout: float,
) -> None:
    """``request`` every ``every`` s on its own connection until ``end``."""
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            async with RawConnection(*address) as conn:
                status, _, retry_after = await send(conn, request, timeout)
            attacks.record(name, status, retry_after)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            attacks.record(name, None)
        await asyncio.sleep(max(0.0, every - (time.monotonic() - t0)))


async def attack(host: str, port: int, dim: int, args: argparse.Namespace, seconds: float) -> Attacks:
    """The attack mix beside the load: ``--slow-connections`` trickling connections; a search of
    ``--expensive-queries`` queries every ``--expensive-every`` s; a search filtered by an ``in``
    of 1,024 values every ``--filter-every`` s."""
    attacks = Attacks()
    end = time.monotonic() + seconds
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((args.expensive_queries, dim)).astype(np.float32)
    heavy = json.dumps({**search_json(vectors, k=args.k), "operating_point": OP}).encode()
    one = search_json(vectors[:1], k=args.k)
    values = [f"g{i}" for i in range(0, 2 * GROUPS, 2)][:1024]  # half of them absent
    filtered = json.dumps({**one, "operating_point": OP, "filter": {"field": "group", "in": values}}).encode()
    slow = RawConnection.request_bytes(host, port, "/v1/search", json.dumps(one).encode())
    tasks = [slow_connection(host, port, slow, end, attacks) for _ in range(args.slow_connections)]
    if args.expensive_every > 0:
        heavy_request = RawConnection.request_bytes(host, port, "/v1/search", heavy)
        tasks.append(repeat((host, port), "expensive", heavy_request, every=args.expensive_every, end=end,
                            attacks=attacks, timeout=args.timeout))
    if args.filter_every > 0 and args.bundle is None:  # the synthetic bundles have the field
        filter_request = RawConnection.request_bytes(host, port, "/v1/search", filtered)
        tasks.append(repeat((host, port), "filter", filter_request, every=args.filter_every, end=end,
                            attacks=attacks, timeout=args.timeout))
    await asyncio.gather(*tasks)
    return attacks


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.array(values) * 1000, q)), 2) if values else None


async def operate(
    server: LiveServer,
    bundles: list[Path],
    registry: Path,
    names: list[str],
    *,
    args: argparse.Namespace,
    seconds: float,
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    """Reload every ``reload_every`` s and change the registry every ``registry_every`` s."""
    done: dict[str, Any] = {"reloads": 0, "reload_failures": 0, "registry_changes": 0, "reload_seconds": []}
    start = time.monotonic()
    next_reload, next_registry = args.reload_every, args.registry_every
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        while time.monotonic() - start < seconds - 1:
            t = time.monotonic() - start
            if t >= next_registry:
                done["registry_changes"] += 1
                atomic_write_text(registry, json.dumps(registry_doc(names, done["registry_changes"])))
                next_registry += args.registry_every
            if t >= next_reload:
                target = bundles[(done["reloads"] + 1) % len(bundles)]
                t0 = time.monotonic()
                try:
                    r = await http.post(
                        "/v1/admin/reload", json={"path": str(target)},
                        headers={"authorization": f"Bearer {server.token}"},
                    )
                    ok, why = r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                done["reloads" if ok else "reload_failures"] += 1
                done["reload_seconds"].append(round(time.monotonic() - t0, 2))
                if not ok:
                    done.setdefault("reload_errors", []).append(why)
                samples.append({"t": round(t, 1), **proc_stats(server.proc.pid)})
                next_reload += args.reload_every
            await asyncio.sleep(0.2)
    return done


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    layout = SubspaceLayout.from_dims(DEFAULT_DIMS)
    machine_facts = machine()  # before pinning: the machine's cores, not the client's
    cores = split_cores(args.pin)
    if args.bundle is not None:
        bundles = [args.bundle.resolve(), args.bundle.resolve()]
    else:
        progress(f"synthetic bundles: 2 x {args.docs} docs")
        bundles = [synthetic_bundle(tmp / f"b{s}", args.docs, seed=s, groups=GROUPS) for s in range(2)]
    from esp_retrieval.subspace.bundle import read_manifest

    names = [o["name"] for o in read_manifest(bundles[0])["layout"]["objectives"]]
    dim = sum(int(o["dim"]) for o in read_manifest(bundles[0])["layout"]["objectives"])
    if args.bundle is None:
        assert dim == layout.dim
    registry = tmp / "registry.json"
    atomic_write_text(registry, json.dumps(registry_doc(names, 0)))
    token = "soak-" + secrets.token_hex(8)
    settings = {"backend": args.backend, "threads": args.threads or None, "registry_poll_seconds": 1}
    rng = np.random.default_rng(0)
    q = normalize_blocks(rng.standard_normal((512, dim)).astype(np.float32), SubspaceLayout.from_dict(
        read_manifest(bundles[0])["layout"]))
    bodies = [json.dumps({**search_json(row[None], k=args.k), "operating_point": OP}).encode() for row in q]

    def start(name: str, budget_ms: float | None) -> tuple[LiveServer, str, int, list[bytes]]:
        if cores is not None:
            pin(cores[1])  # the server inherits the server's cores
        try:
            server = live_server.start_server(
                bundles[0], tmp / f"{name}.log", settings={**settings, "latency_budget_ms": budget_ms},
                token=token, registry=registry, args=["--log-level", "warning", "--no-access-log"],
                ready_timeout=300,
            )
        finally:
            if cores is not None:
                pin(cores[0])  # and this process, the load client, keeps its own
        split = urlsplit(server.url)
        host, port = split.hostname or "127.0.0.1", split.port or 80
        return server, host, port, [RawConnection.request_bytes(host, port, "/v1/search", b) for b in bodies]

    progress("calibration server (admission defaults): unloaded, then the peak")
    server, host, port, requests = start("calibration", None)
    try:
        conns = Conns(host, port, size=args.connections)
        await closed_loop(conns, requests, 1, 1.0, args.timeout)  # warm
        cal, cal_other = await closed_loop(conns, requests, 1, args.unloaded_seconds, args.timeout)
        peak_lat, peak_other = await closed_loop(
            conns, requests, args.peak_concurrency, args.peak_seconds, args.timeout
        )
        cal_p99 = pct(cal, 99)
        assert cal_p99 is not None
        budget_ms = args.latency_budget_ms or round(args.budget_over_unloaded * cal_p99, 2)
        progress(f"goodput peak: closed-loop callers within the objective of {budget_ms} ms")
        levels = await goodput_levels(conns, requests, args, budget_ms)
        await conns.close()
    finally:
        server.stop()
    peak = len(peak_lat) / args.peak_seconds
    within = [lv for lv in levels if lv["within_objective"]]
    goodput = max((lv["answered_per_s"] for lv in within), default=0.0)
    calibration = {"requests": len(cal), "p50_ms": pct(cal, 50), "p99_ms": cal_p99, "not_200": cal_other}
    server, host, port, requests = start("server", budget_ms)
    try:
        conns = Conns(host, port, size=args.connections)
        progress(f"unloaded: one closed-loop caller (latency budget {budget_ms} ms)")
        await closed_loop(conns, requests, 1, 1.0, args.timeout)  # warm
        unloaded, unloaded_other = await closed_loop(conns, requests, 1, args.unloaded_seconds, args.timeout)
        rate = args.overload * (goodput if args.overload_of == "goodput" else peak)
        seconds = args.minutes * 60
        base = (f"the goodput peak {goodput:.0f}/s" if args.overload_of == "goodput"
                else f"the peak {peak:.0f}/s")
        progress(f"soak: {rate:.0f}/s offered ({args.overload}x {base}), {seconds:.0f}s")
        samples = [{"t": 0.0, **proc_stats(server.proc.pid)}]
        c0, cpu0 = time.perf_counter(), time.process_time()
        client_lag: list[float] = []
        tally, ops, _, attacks = await asyncio.gather(
            open_loop(conns, requests, rate, seconds, args.timeout),
            operate(server, bundles, registry, names, args=args, seconds=seconds, samples=samples),
            loop_lag(seconds, client_lag),
            attack(host, port, dim, args, seconds),
        )
        elapsed = time.perf_counter() - c0
        client_cpu = (time.process_time() - cpu0) / elapsed
        samples.append({"t": round(elapsed, 1), **proc_stats(server.proc.pid)})
        await conns.close()
        refusals = admission_refusals(server.url)  # by reason, as the server counted them
    finally:
        server.stop()
    after_reloads = samples[1:]
    first, last = (after_reloads[0], after_reloads[-1]) if after_reloads else (samples[0], samples[-1])
    total = sum(tally.status.values()) + tally.lost_reasons.get("connect: OSError", 0)
    answered = tally.status.get(200, 0)
    unloaded_p99 = pct(unloaded, 99)
    admitted_p99 = pct(tally.ok, 99)
    fivexx = sum(n for s, n in tally.status.items() if s >= 500)
    return {
        "bench": "soak",
        "minutes": args.minutes,
        "bundle": str(args.bundle) if args.bundle else f"synthetic {args.docs} x {dim}",
        "backend": args.backend,
        "latency_budget_ms": budget_ms,
        "latency_budget_from": "--latency-budget-ms" if args.latency_budget_ms
        else f"{args.budget_over_unloaded} x the calibration's unloaded p99",
        "calibration": calibration,
        "client_loop_lag_p99_ms": pct(client_lag, 99),
        "client_cpu_share": round(client_cpu, 3),  # of one core, during the soak
        "pinned": None if cores is None
        else {"client_cores": sorted(cores[0]), "server_cores": sorted(cores[1])},
        "unloaded": {"requests": len(unloaded), "p50_ms": pct(unloaded, 50), "p99_ms": unloaded_p99,
                     "not_200": unloaded_other},
        "peak": {"server": "calibration", "concurrency": args.peak_concurrency,
                 "answered_per_s": round(peak, 1), "p99_ms": pct(peak_lat, 99), "not_200": peak_other},
        "goodput_peak": {"server": "calibration", "objective_ms": budget_ms,
                         "answered_per_s": round(goodput, 1), "levels": levels},
        "overload_of": args.overload_of,
        "offered_per_s": round(rate, 1),
        "answered_per_s": round(answered / elapsed, 1),
        "answered_over_peak": round(answered / elapsed / peak, 3) if peak else None,
        "answered_over_goodput_peak": round(answered / elapsed / goodput, 3) if goodput else None,
        "requests": total + tally.lost,
        "statuses": {str(k): v for k, v in sorted(tally.status.items())},
        "share_429": round(tally.status.get(429, 0) / max(1, total), 4),
        "admitted_p50_ms": pct(tally.ok, 50),
        "admitted_p99_ms": admitted_p99,
        "admitted_p99_over_unloaded_p99": round(admitted_p99 / unloaded_p99, 2)
        if admitted_p99 and unloaded_p99 else None,
        "admitted_p99_over_calibration_p99": round(admitted_p99 / cal_p99, 2) if admitted_p99 else None,
        "admitted_send_delay_p99_ms": pct(tally.ok_send_delay, 99),
        "refusals_by_reason": dict(sorted(refusals.items())),
        "count_5xx": fivexx,
        "lost": tally.lost,
        "attacks": {
            "slow_connections": args.slow_connections, "expensive_queries": args.expensive_queries,
            "statuses": {
                a: {str(k): v for k, v in sorted(by.items())} for a, by in sorted(attacks.status.items())
            },
            "lost": attacks.lost,
        },
        "lost_reasons": tally.lost_reasons,
        "refusals_without_retry_after": tally.no_retry_after,
        "connections": args.connections,
        "connections_opened": conns.opened,
        **ops,
        "rss_mb": {
            "start": samples[0]["rss_mb"], "after_first_reload": first["rss_mb"], "end": last["rss_mb"]
        },
        "threads": {
            "start": samples[0]["threads"], "after_first_reload": first["threads"], "end": last["threads"]
        },
        "thread_names": {"after_first_reload": first["thread_names"], "end": last["thread_names"]},
        "rss_end_over_first_reload": round(last["rss_mb"] / first["rss_mb"], 3),
        "threads_end_over_first_reload": round(last["threads"] / first["threads"], 3),
        "samples": [{k: v for k, v in sample.items() if k != "thread_names"} for sample in samples],
        "machine": machine_facts,
    }


def run_client(main: Coroutine[Any, Any, dict[str, Any]], fast: bool) -> dict[str, Any]:
    """Run the load client on uvloop when ``fast`` and it is installed (it comes with uvicorn's
    standard extras; the server runs on it too): a cheaper event loop leaves the client's core
    less busy, so less of the client's own delay lands in the latencies it measures."""
    if fast:
        try:
            import uvloop
        except ImportError:
            fast = False
        else:
            result = uvloop.run(main)
            result["client_event_loop"] = "uvloop"
            return result
    result = asyncio.run(main)
    result["client_event_loop"] = "asyncio"
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    p.add_argument("--quick", action="store_true", help="a smoke run: small corpus, ~1 minute in all")
    p.add_argument("--bundle", type=Path, help="serve this bundle (reloaded onto itself); default synthetic")
    p.add_argument("--docs", type=int, default=24884, help="synthetic corpus size (default: the demo's)")
    p.add_argument("--backend", default="numpy")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--overload", type=float, default=2.0, help="offered load as a multiple of the peak")
    p.add_argument("--overload-of", choices=("peak", "goodput"), default="peak",
                   help="the peak --overload multiplies: the closed-loop peak (default) or the goodput peak, "
                   "the most answered within the objective")
    p.add_argument("--goodput-seconds", type=float, default=5.0,
                   help="seconds per concurrency level of the goodput peak (default 5)")
    p.add_argument("--reload-every", type=float, default=60.0, help="seconds between hot reloads")
    p.add_argument("--registry-every", type=float, default=120.0, help="seconds between registry changes")
    p.add_argument("--peak-concurrency", type=int, default=32)
    p.add_argument("--connections", type=int, default=256, help="the client's connection pool in the soak")
    p.add_argument("--peak-seconds", type=float, default=15.0)
    p.add_argument("--unloaded-seconds", type=float, default=10.0)
    p.add_argument(
        "--latency-budget-ms", type=float, default=None,
        help="the server's latency objective (ESP_LATENCY_BUDGET_MS); default: from a calibration server",
    )
    p.add_argument(
        "--budget-over-unloaded", type=float, default=2.0,
        help="without --latency-budget-ms: the objective as this multiple of the calibration's unloaded p99",
    )
    p.add_argument(
        "--uvloop", action=argparse.BooleanOptionalAction, default=True,
        help="run the load client on uvloop when installed (default)",
    )
    p.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=True,
        help="load client on the first core, server on the others (default; needs two cores)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take before it is lost")
    p.add_argument("--slow-connections", type=int, default=64,
                   help="attack: connections trickling a search body, 1 byte per 5 s (default 64; 0: none)")
    p.add_argument("--expensive-queries", type=int, default=256,
                   help="attack: queries of the expensive search (default 256)")
    p.add_argument("--expensive-every", type=float, default=2.0,
                   help="attack: seconds between expensive searches (default 2; 0: none)")
    p.add_argument("--filter-every", type=float, default=1.0,
                   help="attack: seconds between searches filtered by an `in` of 1,024 values "
                   "(default 1; 0: none)")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes, args.docs = min(args.minutes, 0.5), min(args.docs, 5000)
        args.reload_every, args.registry_every = 6.0, 12.0
        args.peak_seconds, args.unloaded_seconds, args.goodput_seconds = 4.0, 3.0, 1.5
        args.slow_connections = min(args.slow_connections, 8)
    with tempfile.TemporaryDirectory(prefix="esp-soak-") as tmp:
        result = run_client(run(args, Path(tmp)), args.uvloop)
    emit(result)
    clean = result["count_5xx"] == 0 and result["lost"] == 0 and not result["attacks"]["lost"]
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
