"""Helpers shared by the benchmarks: seeded data, interleaved timing, machine facts, one JSON line.

Every benchmark prints exactly one JSON line on stdout (progress goes to stderr), so a CI job or
a notebook can collect results with ``json.loads(line)``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks, reference_scores


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit(result: Mapping[str, Any]) -> None:
    """The benchmark's one line on stdout."""
    print(json.dumps(result, sort_keys=True, default=_jsonable), flush=True)


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def random_corpus(n: int, layout: SubspaceLayout, seed: int, chunk: int = 65536) -> np.ndarray:
    """``(n, D)`` float32 block-normalised Gaussian rows, generated in chunks (no big temporaries)."""
    out = np.empty((n, layout.dim), np.float32)
    for i, start in enumerate(range(0, n, chunk)):
        rng = np.random.default_rng([seed, i])
        stop = min(n, start + chunk)
        out[start:stop] = normalize_blocks(
            rng.standard_normal((stop - start, layout.dim), np.float32), layout
        )
    return out


def random_queries(nq: int, layout: SubspaceLayout, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Block-normalised queries ``(nq, D)`` float32 and per-row block weights ``(nq, K)`` in [0.25, 1]."""
    rng = np.random.default_rng([seed, 10**6])
    q = normalize_blocks(rng.standard_normal((nq, layout.dim), np.float32), layout)
    w = rng.uniform(0.25, 1.0, (nq, len(layout)))
    return q, w


def reference_topk(
    queries: np.ndarray, corpus: np.ndarray, block_weights: np.ndarray, layout: SubspaceLayout, k: int
) -> np.ndarray:
    """Float64 brute force (per-block loop), chunked over the corpus: ``(nq, k)`` rows, ties -> lower row."""
    best_rows = np.empty((len(queries), 0), np.int64)
    best = np.empty((len(queries), 0))
    for start in range(0, corpus.shape[0], 65536):
        s = reference_scores(queries, corpus[start : start + 65536], block_weights, layout)
        rows = np.broadcast_to(np.arange(start, start + s.shape[1]), s.shape)
        s, rows = np.concatenate([best, s], 1), np.concatenate([best_rows, rows], 1)
        order = np.lexsort((rows, -s), axis=-1)[:, :k]
        best, best_rows = np.take_along_axis(s, order, 1), np.take_along_axis(rows, order, 1)
    return best_rows


def interleaved(
    fns: Mapping[str, Callable[[], object]], repeats: int, budget_s: float = 30.0
) -> dict[str, list[float]]:
    """Time each function ``repeats`` times, rotating the order every round (after one warm-up).

    A function whose total time passes ``budget_s`` stops being repeated (at least one timing).
    Returns seconds per call, per name.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    spent = dict.fromkeys(fns, 0.0)
    for name, fn in fns.items():  # warm-up: page-ins, thread pools, first-call allocations
        t0 = time.perf_counter()
        fn()
        spent[name] += time.perf_counter() - t0
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if times[name] and spent[name] > budget_s:
                continue
            t0 = time.perf_counter()
            fns[name]()
            dt = time.perf_counter() - t0
            times[name].append(dt)
            spent[name] += dt
    return times


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def machine() -> dict[str, Any]:
    """CPU model, cores, load, and which BLAS kernels are loaded (threadpoolctl)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [
            {k: lib.get(k) for k in ("internal_api", "version", "architecture", "num_threads", "prefix")}
            for lib in threadpool_info()
            if lib.get("user_api") == "blas"
        ]
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
