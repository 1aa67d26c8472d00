"""Exhaustive weighted kNN on a GPU: the ``cupy`` backend against torch and faiss-gpu, one run.

One prepared script sized for about five minutes of a device: N = 10M rows x 384 (blocks
256 / 96 / 32, float16, random block-normalised, generated on the device), per-row weights,
batches of 1 / 16 / 256 / 1024 queries, k = 10 and 1000. The same run measures

- the device's copy bandwidth (a device-to-device copy of 4 GiB: bytes read + written per
  second) and its float16 GEMM rate (``cupy.matmul`` 8192^3, float32 accumulation);
- our engine (``create_engine("cupy", ..., precision="float16")``: exact top k, re-ranked in
  float64), torch (``mm`` + ``topk`` over the same float16 corpus, chunked alike, no re-rank)
  and faiss-gpu (``GpuIndexFlatIP``, float16 storage) when it imports;
- recall@k of each against a float64 brute force of a sample of queries.

Prints one JSON line: ms per query per method / batch / k, ``bandwidth_fraction`` (batch 1:
corpus bytes per second of our scan over the copy bandwidth), ``tensor_core_fraction`` (batch
1024: ``2 nq N D`` flop per second over the GEMM rate), ``ratio_vs_torch`` and
``ratio_vs_faiss`` (their time over ours: above 1 means ours is faster), ``recall``.

``--smoke``: a tiny corpus on the CPU when cupy cannot run (numpy for the array code, torch on
the CPU, faiss-cpu's ``IndexFlatIP`` in faiss-gpu's place), to check that the script runs and
prints valid JSON; its numbers say nothing about a GPU. On a device, ``--smoke`` runs tiny too.

    python bench/knn_gpu.py            # on the GPU machine
    python bench/knn_gpu.py --smoke    # anywhere
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, progress
from esp_retrieval.service.engine import create_engine
from esp_retrieval.service.engine.cupy_backend import cuda_unavailable_reason
from esp_retrieval.subspace.engine.array_scan import ArrayScanBackend
from esp_retrieval.subspace.engine.base import Backend
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims({"semantic": 256, "entity": 96, "intent": 32})
BATCHES = (1, 16, 256, 1024)
KS = (10, 1000)
METHODS = ("ours", "torch", "faiss")


class Device:
    """What the bench needs from where it runs: the array module, a sync, torch's device."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        if gpu:
            import cupy

            self.xp: Any = cupy
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        else:
            self.xp = np
            self.name = "cpu (smoke: numpy / torch cpu / faiss-cpu)"
        self.torch: Any = None
        try:
            import torch

            if not gpu or torch.cuda.is_available():
                self.torch = torch
        except ImportError:
            pass
        self.torch_device = "cuda" if gpu else "cpu"

    def sync(self) -> None:
        if self.gpu:
            self.xp.cuda.Device().synchronize()
            if self.torch is not None:
                self.torch.cuda.synchronize()

    def host(self, x: Any) -> np.ndarray:
        return np.asarray(self.xp.asnumpy(x)) if self.gpu else np.asarray(x)


def timed(dev: Device, fn: Callable[[], object], reps: int, budget_s: float) -> float:
    """Median seconds of ``fn`` over up to ``reps`` runs (after one warm-up) within ``budget_s``."""
    fn()
    dev.sync()
    times: list[float] = []
    spent = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        dev.sync()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent > budget_s:
            break
    return float(np.median(times))


def make_corpus(dev: Device, n: int, seed: int, chunk: int = 1 << 20) -> np.ndarray:
    """``(n, D)`` float16 block-normalised Gaussian rows, generated (on the device) in chunks."""
    xp = dev.xp
    out = np.empty((n, LAYOUT.dim), np.float16)
    ind = xp.asarray(LAYOUT.indicator(np.float32))
    rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random.RandomState(seed)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        x = rng.standard_normal((stop - start, LAYOUT.dim), dtype=xp.float32)
        norms = xp.sqrt((x * x) @ ind)
        out[start:stop] = dev.host((x / (norms @ ind.T)).astype(xp.float16))
    return out


def queries(nq: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 7])
    q = rng.standard_normal((nq, LAYOUT.dim)).astype(np.float32)
    ind = LAYOUT.indicator(np.float32)
    q /= np.sqrt((q * q) @ ind) @ ind.T
    return q, rng.uniform(0.25, 1.0, (nq, len(LAYOUT)))


def copy_bandwidth(dev: Device, nbytes: int, budget_s: float) -> float:
    """Bytes per second moved (read + write) by a device-to-device (host: memcpy) copy."""
    xp = dev.xp
    a = xp.ones(nbytes // 4, xp.float32)
    b = xp.empty_like(a)

    def copy() -> None:
        xp.copyto(b, a)

    return 2.0 * a.nbytes / timed(dev, copy, 20, budget_s)


def gemm_rate(dev: Device, size: int, budget_s: float) -> float:
    """Flop per second of a square float16 GEMM (float32 on the CPU smoke run)."""
    xp = dev.xp
    dtype = xp.float16 if dev.gpu else xp.float32
    a = xp.ones((size, size), dtype)
    b = xp.ones((size, size), dtype)
    return 2.0 * size**3 / timed(dev, lambda: xp.matmul(a, b), 20, budget_s)


class TorchMmTopk:
    """torch's way: ``mm`` of the block-scaled float16 queries with the corpus, ``topk``, merged
    over chunks of the same size as ours; no re-rank (float16 scores decide)."""

    def __init__(self, dev: Device, engine: Backend, workspace_bytes: int) -> None:
        torch = dev.torch
        self.torch = torch
        data = engine._data  # type: ignore[attr-defined]
        self.corpus = torch.from_dlpack(data) if dev.gpu else torch.from_numpy(np.asarray(data))
        self.dtype = torch.float16 if dev.gpu else torch.float32
        if self.corpus.dtype != self.dtype:
            self.corpus = self.corpus.to(self.dtype)
        self.device = dev.torch_device
        self.workspace = workspace_bytes

    def search(self, q: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
        torch = self.torch
        scaled = torch.from_numpy(q * LAYOUT.expand(w)).to(self.device, self.dtype)
        n = self.corpus.shape[0]
        chunk = max(1024, self.workspace // (2 * len(q)))
        best_v = best_i = None
        for s in range(0, n, chunk):
            scores = scaled @ self.corpus[s : s + chunk].T
            v, i = torch.topk(scores, min(k, scores.shape[1]), dim=1)
            i = i + s
            if best_v is not None:
                v, j = torch.topk(torch.cat([best_v, v], 1), k, dim=1)
                i = torch.gather(torch.cat([best_i, i], 1), 1, j)
            best_v, best_i = v, i
        assert best_i is not None
        return best_i.cpu().numpy()


class FaissFlat:
    """faiss-gpu ``GpuIndexFlatIP`` with float16 storage (faiss-cpu ``IndexFlatIP`` in smoke)."""

    def __init__(self, dev: Device, corpus: np.ndarray) -> None:
        import faiss

        d = corpus.shape[1]
        if dev.gpu:
            if not hasattr(faiss, "StandardGpuResources"):
                raise ImportError("this faiss has no GPU support (faiss-gpu is not installed)")
            self.res = faiss.StandardGpuResources()
            cfg = faiss.GpuIndexFlatConfig()
            cfg.useFloat16 = True
            self.index: Any = faiss.GpuIndexFlatIP(self.res, d, cfg)
            self.kind = "faiss_gpu_flat_ip_fp16"
        else:
            self.index = faiss.IndexFlatIP(d)
            self.kind = "faiss_cpu_flat_ip"
        for s in range(0, corpus.shape[0], 1 << 20):
            self.index.add(np.ascontiguousarray(corpus[s : s + (1 << 20)], dtype=np.float32))

    def search(self, q: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
        scaled = np.ascontiguousarray(q * LAYOUT.expand(w), dtype=np.float32)
        return np.asarray(self.index.search(scaled, k)[1])


def exact_topk(dev: Device, engine: Backend, q: np.ndarray, w: np.ndarray, *, k: int) -> list[set[int]]:
    """Float64 brute force of the (float16) master on the device, chunked: the top-k row sets."""
    xp = dev.xp
    data: Any = getattr(engine, "_master_dev", None)
    if data is None:
        data = xp.asarray(engine.master)
    corpus = engine.master
    scaled = xp.asarray(q.astype(np.float64) * LAYOUT.expand(w))
    best_s = best_r = None
    for s in range(0, corpus.shape[0], 1 << 20):
        block = data[s : s + (1 << 20)].astype(xp.float64)
        scores = scaled @ block.T
        order = xp.argsort(-scores, axis=1)[:, :k]
        vals = xp.take_along_axis(scores, order, axis=1)
        rows = order + s
        if best_s is not None:
            vals = xp.concatenate([best_s, vals], 1)
            rows = xp.concatenate([best_r, rows], 1)
            keep = xp.argsort(-vals, axis=1)[:, :k]
            vals, rows = xp.take_along_axis(vals, keep, 1), xp.take_along_axis(rows, keep, 1)
        best_s, best_r = vals, rows
    return [set(r) for r in dev.host(best_r).tolist()]


def _bind(method: Any, q: np.ndarray, w: np.ndarray, k: int, *, rows: bool = False) -> Callable[[], Any]:
    """A call of ``method.search(q, w, k)`` (its rows, for our engine's result)."""

    def call() -> Any:
        out = method.search(q, w, k)
        return out.rows if rows else out

    return call


def recall(found: np.ndarray, truth: list[set[int]]) -> float:
    k = len(next(iter(truth)))
    return float(np.mean([len(set(f[:k].tolist()) & t) / k for f, t in zip(found, truth, strict=True)]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    reason = cuda_unavailable_reason()
    gpu = reason is None
    if not gpu and not args.smoke:
        raise SystemExit(f"no usable GPU ({reason}); run with --smoke to check the script on a CPU")
    dev = Device(gpu)
    n = args.n or (5_000 if args.smoke else 10_000_000)
    batches = tuple(args.batches or ((1, 8, 32) if args.smoke else BATCHES))
    ks = tuple(args.k or ((10, 100) if args.smoke else KS))
    progress(f"device {dev.name}; N={n} x {LAYOUT.dim} float16; batches {batches}; k {ks}")

    bandwidth = copy_bandwidth(dev, (16 << 20) if args.smoke else (4 << 30), budget_s=1 if args.smoke else 10)
    gemm = gemm_rate(dev, 256 if args.smoke else 8192, budget_s=1 if args.smoke else 10)
    progress(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s, GEMM {gemm / 1e12:.1f} Tflop/s")

    t0 = time.perf_counter()
    corpus = make_corpus(dev, n, seed=0)
    progress(f"corpus generated in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    if gpu:
        engine: Backend = create_engine("cupy", corpus, LAYOUT, precision="float16")
    else:
        engine = ArrayScanBackend(corpus, LAYOUT, precision="float16")
    progress(f"engine {engine.name} started in {time.perf_counter() - t0:.1f}s")
    workspace = int(getattr(engine, "workspace_bytes", 1 << 30))

    others: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if dev.torch is not None:
        others["torch"] = TorchMmTopk(dev, engine, workspace)
    else:
        skipped["torch"] = "torch with CUDA is not importable"
    try:
        t0 = time.perf_counter()
        others["faiss"] = FaissFlat(dev, corpus)
        progress(f"faiss index ({others['faiss'].kind}) built in {time.perf_counter() - t0:.1f}s")
    except ImportError as exc:
        skipped["faiss"] = str(exc)
        progress(f"faiss skipped: {exc}")

    cells: list[dict[str, Any]] = []
    ms: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    rec: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    sample = min(8, max(batches))
    cell_budget = args.cell_budget if args.cell_budget is not None else (0.3 if args.smoke else 3.0)
    for k in ks:
        qs, ws = queries(max(batches), seed=k)
        truth = exact_topk(dev, engine, qs[:sample], ws[:sample], k=k)
        for b in batches:
            q, w = qs[:b], ws[:b]
            fns: dict[str, Callable[[], Any]] = {"ours": _bind(engine, q, w, k, rows=True)}
            for name, other in others.items():
                fns[name] = _bind(other, q, w, k)
            for name, fn in fns.items():
                reps = 3 if b >= 256 else 10
                sec = timed(dev, fn, reps, budget_s=cell_budget)
                key = f"b{b}_k{k}"
                ms[name][key] = 1e3 * sec / b
                if b >= sample:
                    rec[name][f"k{k}"] = recall(np.asarray(fn())[:sample], truth)
                cells.append({"method": name, "batch": b, "k": k, "ms_per_batch": 1e3 * sec,
                              "ms_per_query": 1e3 * sec / b})
                progress(f"{name:5s} batch {b:4d} k {k:4d}: {1e3 * sec:9.3f} ms/batch")

    corpus_bytes = float(corpus.nbytes)
    first, last = min(batches), max(batches)
    bw_frac = {f"k{k}": corpus_bytes / (ms["ours"][f"b{first}_k{k}"] * first / 1e3) / bandwidth for k in ks}
    tc_frac = {
        f"k{k}": 2.0 * last * n * LAYOUT.dim / (ms["ours"][f"b{last}_k{k}"] * last / 1e3) / gemm for k in ks
    }

    def ratios(name: str) -> dict[str, float]:
        return {key: ms[name][key] / ours for key, ours in ms["ours"].items() if key in ms[name]}

    vs_torch, vs_faiss = ratios("torch"), ratios("faiss")

    result = {
        "bench": "knn_gpu",
        "mode": "gpu" if gpu else "smoke-cpu",
        "smoke": bool(args.smoke),
        "device": dev.name,
        "n": n,
        "dim": LAYOUT.dim,
        "storage": "float16",
        "batches": list(batches),
        "k": list(ks),
        "engine": engine.name,
        "selection": getattr(engine, "selection", "argpartition"),
        "rescans": engine.rescans,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "gemm_tflops": gemm / 1e12,
        "ms_per_query": ms,
        "bandwidth_fraction": bw_frac,
        "tensor_core_fraction": tc_frac,
        "ratio_vs_torch": vs_torch or None,
        "ratio_vs_faiss": vs_faiss or None,
        "faiss_kind": others["faiss"].kind if "faiss" in others else None,
        "recall": rec,
        "skipped": skipped,
        "cells": cells,
        "seconds": time.perf_counter() - t_start,
    }
    result["goals"] = {
        "bandwidth_fraction_ge_0_85": min(bw_frac.values()) >= 0.85,
        "tensor_core_fraction_ge_0_60": min(tc_frac.values()) >= 0.60,
        "ge_1x_torch_every_batch": bool(vs_torch) and min(vs_torch.values()) >= 1.0,
        "ge_1x_faiss_every_batch": bool(vs_faiss) and min(vs_faiss.values()) >= 1.0,
        "recall_at_10_is_1": rec["ours"].get("k10") == 1.0,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny corpus; numpy/CPU where cupy cannot run")
    parser.add_argument("--n", type=int, default=None, help="corpus rows (default 10M; smoke 5000)")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--k", type=int, nargs="+", default=None)
    parser.add_argument(
        "--cell-budget", type=float, default=None, help="seconds of timing per cell (default 3; smoke 0.3)"
    )
    emit(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
