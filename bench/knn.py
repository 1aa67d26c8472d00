"""Exhaustive weighted kNN: our engine backends against faiss ``IndexFlatIP``, on this machine.

Random block-normalised data, d=384 in blocks (256, 96, 32), per-row weights, k=10, batches of
1 / 16 / 256 queries, 1 and 2 threads, N = 100k and 1M (``--quick``: 200k, one pass). Every
method of a cell is timed interleaved with the others and repeated; medians are reported. faiss
runs in both of its paths: one SIMD scan per query, and BLAS (forced by lowering
``distance_compute_blas_threshold``). The same run measures the machine's read bandwidth and
float32 GEMM rate, checks that our results equal a float64 brute force, measures the recall of
the low-precision modes, and (full run) the peak memory of a 1M-row float32 engine in a child
process. Prints one JSON line on stdout; progress on stderr.

``bandwidth_fraction``: the batch-1 float32 scan against a streaming read (``torch.sum``) of the
same corpus with the same threads, timed interleaved in the same cell, median over median
(``bandwidth_fraction_best``: best over best). On a shared machine the read rate moves with the
load, so the denominator must be measured under the same load and with the same statistic.

    python bench/knn.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# OpenMP threads (faiss, torch) that spin while they wait collapse when the cores are shared with
# other work; passive waiting keeps the comparison about the kernels. Set before they load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench._common import (
    emit,
    interleaved,
    machine,
    median,
    progress,
    random_corpus,
    random_queries,
    reference_topk,
)
from esp_retrieval.service.engine import create_engine
from esp_retrieval.subspace.engine.base import Backend
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims({"semantic": 256, "entity": 96, "intent": 32})
EXACT = ("numpy", "torch")
LOWP = ("torch_float16", "torch_bfloat16")
FAISS = ("faiss_simd", "faiss_blas")
READ = "read_torch_sum"  # streaming read of the corpus (torch.sum), timed in the batch-1 cells
# faiss's SIMD path scans once per query (~batch x the batch-1 time): not timed above this batch
SIMD_MAX_BATCH = 16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="N=200k only, fewer repeats (under a minute)")
    p.add_argument("--sizes", type=int, nargs="+", help="corpus sizes (default 100000 1000000)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    p.add_argument("--threads", type=int, nargs="+", help="thread counts (default 1 2; quick: 2)")
    p.add_argument("--repeats", type=int, help="timed repeats per cell (default 5; quick: 3)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--memory", choices=["on", "off"], help="measure peak RSS at N=1M (default: on unless quick)"
    )
    p.add_argument("--memory-child", nargs=2, metavar=("N", "BACKEND"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- machine limits ------------------------------------------------------------------------------
def read_bandwidth(buf: np.ndarray, threads: list[int]) -> dict[str, float]:
    """Best GB/s of a few streaming read kernels over ``buf`` (larger than the caches)."""
    import torch
    from threadpoolctl import threadpool_limits

    t = torch.from_numpy(buf)
    out: dict[str, float] = {}
    for n in threads:
        torch.set_num_threads(n)
        kernels: dict[str, Callable[[], object]] = {f"torch_sum_{n}t": t.sum, f"torch_amax_{n}t": t.amax}
        if n == 1:
            kernels["numpy_colsum_1t"] = lambda: np.add.reduce(buf, axis=0)
        with threadpool_limits(n):
            times = interleaved(kernels, repeats=5, budget_s=5.0)
        out.update({name: buf.nbytes / min(ts) / 1e9 for name, ts in times.items()})
    torch.set_num_threads(max(threads))
    return out


def gemm_rate(threads: list[int], n: int = 2048) -> dict[str, float]:
    """float32 GEMM GFLOP/s of numpy's BLAS and of torch, for square ``n`` matrices."""
    import torch
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).standard_normal((n, n), np.float32)
    ta = torch.from_numpy(a)
    out: dict[str, float] = {}
    for t in threads:
        torch.set_num_threads(t)
        with threadpool_limits(t):
            times = interleaved({"numpy": lambda: a @ a, "torch": lambda: ta @ ta}, repeats=3, budget_s=5.0)
        out.update({f"{name}_float32_{t}t": 2 * n**3 / min(ts) / 1e9 for name, ts in times.items()})
    torch.set_num_threads(max(threads))
    return out


# --- one corpus size --------------------------------------------------------------------------------
def bench_size(n: int, args: argparse.Namespace, threads: list[int]) -> dict[str, Any]:
    import faiss
    import torch

    progress(f"N={n}: generating data")
    corpus = random_corpus(n, LAYOUT, args.seed)
    queries, weights = random_queries(max(args.batches), LAYOUT, args.seed)
    scaled_all = (queries * LAYOUT.expand(weights)).astype(np.float32)

    progress(f"N={n}: building indexes")
    flat = faiss.IndexFlatIP(LAYOUT.dim)
    flat.add(corpus)
    engines: dict[str, Backend] = {
        "numpy": create_engine("numpy", corpus, LAYOUT),
        "torch": create_engine("torch", corpus, LAYOUT),
        "torch_float16": create_engine("torch", corpus, LAYOUT, precision="float16"),
        "torch_bfloat16": create_engine("torch", corpus, LAYOUT, precision="bfloat16"),
    }

    def faiss_search(scaled: np.ndarray, blas: bool) -> Any:
        faiss.cvar.distance_compute_blas_threshold = 0 if blas else 1 << 30
        return flat.search(scaled, args.k)

    cells: list[dict[str, Any]] = []
    read = torch.from_numpy(corpus)
    for t in threads:
        faiss.omp_set_num_threads(t)
        torch.set_num_threads(t)
        for e in engines.values():
            e.set_threads(t)
        for b in args.batches:
            q, w, s = queries[:b], weights[:b], scaled_all[:b]
            fns: dict[str, Any] = {
                name: (lambda e=e, q=q, w=w: e.search(q, w, args.k)) for name, e in engines.items()
            }
            fns["faiss_blas"] = lambda s=s: faiss_search(s, True)
            if b <= SIMD_MAX_BATCH:
                fns["faiss_simd"] = lambda s=s: faiss_search(s, False)
            if b == 1:
                # the bandwidth a batch-1 scan is held against: a streaming read of the same bytes
                # with the same threads, timed interleaved with the scans (same load, same median)
                fns[READ] = read.sum
            progress(f"N={n} threads={t} batch={b}: {', '.join(fns)}")
            times = interleaved(fns, args.repeats, budget_s=3.0 if args.quick else 30.0)
            for name, ts in times.items():
                med = median(ts)
                cells.append(
                    {
                        "n": n,
                        "threads": t,
                        "batch": b,
                        "method": name,
                        "ms_per_batch": med * 1e3,
                        "ms_per_batch_best": min(ts) * 1e3,
                        "ms_per_query": med * 1e3 / b,
                        "qps": b / med,
                        "timings": len(ts),
                    }
                )
    faiss.cvar.distance_compute_blas_threshold = 20

    progress(f"N={n}: exactness against a float64 brute force, low-precision recall")
    nref = min(16, len(queries))
    ref = reference_topk(queries[:nref], corpus, weights[:nref], LAYOUT, args.k)
    exact = {
        name: bool((e.search(queries[:nref], weights[:nref], args.k).rows == ref).all())
        for name, e in engines.items()
    }
    truth = engines["numpy"].search(queries, weights, args.k).rows
    recall: dict[str, float] = {}
    for name in LOWP:
        e = engines[name]
        recall[name] = _recall(e.search(queries, weights, args.k).rows, truth)
        scan_rows, _ = e._scan(scaled_all, args.k)  # the low-precision scan alone, no re-rank
        recall[f"{name}_scan_only"] = _recall(scan_rows[:, : args.k], truth)
    rescans = {name: e.rescans for name, e in engines.items()}
    for e in engines.values():
        close = getattr(e, "close", None)
        if close:
            close()
    bw = read_bandwidth(corpus, threads) if n == max(args.sizes) else {}
    return {"cells": cells, "exact": exact, "recall": recall, "rescans": rescans, "bandwidth": bw}


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / truth.size


# --- peak memory (child process) -----------------------------------------------------------------
def memory_child(n: int, backend: str) -> None:
    """Peak RSS of: generate the corpus, start the engine, search batches of 1, 16 and 256."""
    corpus = random_corpus(n, LAYOUT, 0, chunk=8192)
    after_data = peak_rss()
    reset = _reset_peak_rss()
    engine = create_engine(backend, corpus, LAYOUT)
    queries, weights = random_queries(256, LAYOUT, 0)
    for b in (1, 16, 256):
        engine.search(queries[:b], weights[:b], 10)
    peak_engine = peak_rss()
    out = {"peak_rss_bytes": max(after_data, peak_engine), "index_bytes": corpus.nbytes}
    if reset:  # the engine's own peak, with the corpus already resident
        out["peak_rss_engine_bytes"] = peak_engine
    print(json.dumps(out))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux)
    except OSError:
        return False
    return True


def peak_rss() -> int:
    """Peak resident memory of this process, bytes.

    ``VmHWM`` from ``/proc/self/status`` where available: ``ru_maxrss`` would also count the
    parent's memory at fork time (Linux keeps the maximum across ``exec``).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def measure_memory(n: int, backend: str) -> dict[str, Any]:
    progress(f"peak memory: N={n} float32, backend {backend} (child process)")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--memory-child", str(n), backend],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["ratio"] = data["peak_rss_bytes"] / data["index_bytes"]
    if "peak_rss_engine_bytes" in data:
        data["ratio_engine"] = data["peak_rss_engine_bytes"] / data["index_bytes"]
    return data


# --- summary ---------------------------------------------------------------------------------------------
def best_qps(
    cells: list[dict[str, Any]], names: tuple[str, ...], n: int, t: int, b: int
) -> tuple[float, str]:
    rows = [
        c for c in cells if c["n"] == n and c["threads"] == t and c["batch"] == b and c["method"] in names
    ]
    best = max(rows, key=lambda c: c["qps"])
    return best["qps"], best["method"]


def summarise(cells: list[dict[str, Any]], n: int, threads: list[int], batches: list[int]) -> dict[str, Any]:
    tables: dict[str, Any] = {}
    for t in threads:
        for b in batches:
            f_qps, f_name = best_qps(cells, FAISS, n, t, b)
            e_qps, e_name = best_qps(cells, EXACT, n, t, b)
            l_qps, l_name = best_qps(cells, LOWP, n, t, b)
            tables[f"n={n},threads={t},batch={b}"] = {
                "faiss_best": f_name,
                "exact_best": e_name,
                "lowp_best": l_name,
                "ratio_vs_faiss": e_qps / f_qps,
                "ratio_vs_faiss_lowp": l_qps / f_qps,
            }
    return tables


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_child:
        memory_child(int(args.memory_child[0]), args.memory_child[1])
        return 0
    t0 = time.perf_counter()
    args.sizes = args.sizes or ([200_000] if args.quick else [100_000, 1_000_000])
    args.repeats = args.repeats or (3 if args.quick else 5)
    threads = args.threads or ([2] if args.quick else [1, 2])
    memory = (args.memory or ("off" if args.quick else "on")) == "on"

    result: dict[str, Any] = {
        "bench": "knn",
        "quick": args.quick,
        "k": args.k,
        "dim": LAYOUT.dim,
        "layout": dict(zip(LAYOUT.names, LAYOUT.dims, strict=True)),
        "machine": machine(),
        "sizes": args.sizes,
        "threads": threads,
    }
    progress("float32 GEMM rate")
    result["gemm_gflops"] = gemm_rate(threads, 1024 if args.quick else 2048)
    result["faiss_simd_max_batch"] = SIMD_MAX_BATCH
    cells: list[dict[str, Any]] = []
    per_size: dict[str, Any] = {}
    for n in args.sizes:
        out = bench_size(n, args, threads)
        cells += out.pop("cells")
        if out["bandwidth"]:
            result["bandwidth_gbs"] = out["bandwidth"]
        per_size[str(n)] = {k: v for k, v in out.items() if k != "bandwidth"}

    n, t = max(args.sizes), max(threads)
    tables = summarise(cells, n, threads, args.batches)
    head = {b: tables[f"n={n},threads={t},batch={b}"] for b in args.batches}
    result["ratio_vs_faiss"] = {str(b): v["ratio_vs_faiss"] for b, v in head.items()}
    result["ratio_vs_faiss_lowp"] = {str(b): v["ratio_vs_faiss_lowp"] for b, v in head.items()}
    bandwidth = max(result["bandwidth_gbs"].values())
    if 1 in args.batches:
        qps1, _ = best_qps(cells, EXACT, n, t, 1)
        read_qps, _ = best_qps(cells, (READ,), n, t, 1)
        result["scan_gbs_batch1"] = n * LAYOUT.dim * 4 * qps1 / 1e9
        result["read_gbs_batch1_cell"] = n * LAYOUT.dim * 4 * read_qps / 1e9
        # median scan over median read, both timed interleaved in the same cell with the same threads
        result["bandwidth_fraction"] = qps1 / read_qps
        # the same with each side's best timing in that cell (robust to a loaded machine, too)
        cell = {c["method"]: c for c in cells if (c["n"], c["threads"], c["batch"]) == (n, t, 1)}
        best_scan = min(cell[m]["ms_per_batch_best"] for m in EXACT if m in cell)
        result["bandwidth_fraction_best"] = cell[READ]["ms_per_batch_best"] / best_scan
        # the earlier, inconsistent ratio: median scan over the best single timing of the fastest
        # of several read kernels, measured at another time (kept for comparison)
        result["bandwidth_fraction_vs_best_read"] = result["scan_gbs_batch1"] / bandwidth
    result["recall_lowp"] = min(per_size[str(n)]["recall"][name] for name in LOWP)
    result["recall_lowp_scan_only"] = {
        k: v for k, v in per_size[str(n)]["recall"].items() if "scan_only" in k
    }
    result["exact"] = all(all(v["exact"].values()) for v in per_size.values())
    result["per_size"] = per_size
    result["tables"] = tables
    result["cells"] = cells
    if memory:
        mem_n = 1_000_000
        result["memory"] = {b: measure_memory(mem_n, b) for b in ("numpy", "torch")}
        result["peak_rss_ratio"] = result["memory"]["numpy"]["ratio"]
    result["machine"]["loadavg_1m_end"] = machine()["loadavg_1m"]
    result["seconds"] = time.perf_counter() - t0
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
