"""The approximate ``ivf`` engine against the exact scan and plain faiss IVF-Flat / HNSW.

Corpus: ``N`` rows that follow a real bundle's embeddings. Each row is a random document of
the bundle perturbed along the corpus's own covariance: per block,
``normalise(d_src + alpha * (d_a - d_b) / sqrt(2))`` with ``src, a, b`` random documents
(so the noise has the covariance of the documents themselves, and the intent block stays
between its class modes). Queries: the TREC DL 2019 + 2020 query texts encoded by the
bundle's query encoder. Weights: the simplex grid of step ``--grid`` over the layout's blocks
(which contains every single-subspace weight vector). For each weight vector: recall@10
against the exact float64 scan (the numpy backend), the fraction of the corpus the search
scanned, the share of queries answered exactly (stopped by the bound), and ms per query at
batch 1 and 64; beside it, over the concatenated vector with the same block-scaled query,
faiss IVF-Flat (same nlist, nprobe giving the same mean work) and HNSW (recall and
distance computations); and the ``pq`` backend (a 4-bit product-quantised screen of
``--pq-screens`` rows per query, exact re-rank) at each screen depth. The exact scan's ms
per query is timed in the same run (the anchor).

    python bench/ann.py --quick             # small smoke run (seconds)
    python bench/ann.py --n 1000000         # the README's numbers
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench._common import emit, machine, progress
from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.subspace.engine.ivf import EXACT_BELOW, IvfBackend
from esp_retrieval.subspace.engine.ivf_index import (
    IvfIndexError,
    IvfParams,
    build_index,
    load_index,
    save_index,
)
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from esp_retrieval.subspace.engine.pq_screen import POSTING_DENSITY, PqScreenBackend
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

ROOT = Path(__file__).resolve().parents[1]
QUERY_FILES = ("queries.dl19.tsv", "queries.dl20.tsv")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", default=str(ROOT / "artifacts/demo/bundle"), help="source bundle")
    p.add_argument("--data", default=str(ROOT / "data/trec-dl-2019-2020-passage"), help="query files")
    p.add_argument("--quick", action="store_true", help="N=30k, grid 0.5, no timing repeats")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--alpha", type=float, default=0.5, help="perturbation size (see above)")
    p.add_argument("--grid", type=float, default=0.1, help="simplex grid step")
    p.add_argument("--k", type=int, default=10)
    p.add_argument(
        "--max-touched",
        type=float,
        nargs="*",
        default=[0.02, 0.05],
        help="ivf budgets (fractions; none: skip ivf)"
    )
    p.add_argument("--target-misses", type=float, default=0.0, help="optional early stop (0: off)")
    p.add_argument("--nlist", type=int, default=None, help="lists per partition (default sqrt(N))")
    p.add_argument("--list-dtype", default="int8", choices=["int8", "float32"])
    p.add_argument(
        "--groups",
        nargs="+",
        default=None,
        help="partitions, each a comma-separated list of blocks or 'all' (default: one over all blocks)",
    )
    p.add_argument("--time-queries", type=int, default=32, help="queries timed at batch 1 per weight")
    p.add_argument("--exact-weights", type=int, default=3, help="weight vectors the exact scan is timed on")
    p.add_argument(
        "--exact-below",
        type=int,
        default=EXACT_BELOW,
        help="rows below which ivf takes the exact scan (0: always probe, to time the index itself)",
    )
    p.add_argument(
        "--pq-screens", type=int, nargs="*", default=[3000, 10000], help="pq backend: rows screened per query"
    )
    p.add_argument("--pq-dsub", type=int, default=2, help="pq backend: columns per 4-bit code")
    p.add_argument(
        "--pq-posting-density",
        type=float,
        default=POSTING_DENSITY,
        help="pq backend: blocks at most this dense are scored from posting lists (0: screen every block)",
    )
    p.add_argument("--hnsw-m", type=int, default=16)
    p.add_argument("--hnsw-ef", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--no-hnsw", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache", default=None, help="folder to keep the built ivf index in (reused when it fits)"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.n = min(args.n, 30_000)
        args.grid = 0.5
        args.time_queries = 4
        args.exact_weights = 1
        args.hnsw_ef = [64]
    return args


def simplex_grid(k: int, step: float) -> np.ndarray:
    """Every weight vector on the simplex with coordinates in multiples of ``step``."""
    m = round(1.0 / step)
    pts = [c for c in itertools.product(range(m + 1), repeat=k) if sum(c) == m]
    return np.array(pts, np.float64) / m


def synthetic_corpus(
    emb: np.ndarray, layout: SubspaceLayout, n: int, alpha: float, seed: int
) -> tuple[np.ndarray, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    src = np.asarray(emb, np.float32)
    out = np.empty((n, layout.dim), np.float32)
    cos_sum = np.zeros(len(layout))
    for s in range(0, n, 65536):
        m = min(n, s + 65536) - s
        i, a, b = (rng.integers(0, len(src), m) for _ in range(3))
        x = src[i] + (alpha / np.sqrt(2.0)) * (src[a] - src[b])
        out[s : s + m] = normalize_blocks(x, layout)
        cos_sum += ((out[s : s + m] * src[i]) @ layout.indicator(np.float32)).sum(0)
    info = {
        "source_docs": len(src),
        "alpha": alpha,
        "rule": "per block normalise(d_src + alpha*(d_a - d_b)/sqrt(2)), src,a,b uniform over the bundle",
        "mean_cos_to_source": dict(zip(layout.names, np.round(cos_sum / n, 4).tolist(), strict=True)),
    }
    return out, info


def read_queries(folder: Path) -> list[str]:
    texts = []
    for name in QUERY_FILES:
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) >= 2 and parts[1].strip():
                texts.append(parts[1].strip())
    return texts


def recall(found: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.array(
        [len(set(f) & set(t)) / len(t) for f, t in zip(found.tolist(), truth.tolist(), strict=True)]
    )


def block_score_matrices(queries: np.ndarray, corpus: np.ndarray, layout: SubspaceLayout) -> np.ndarray:
    """``(K, nq, N)`` float32 per-block cosines, computed once for every weight vector."""
    out = np.empty((len(layout), len(queries), len(corpus)), np.float32)
    for s in range(0, len(corpus), 65536):
        block = corpus[s : s + 65536]
        for b, obj in enumerate(layout):
            sl = slice(obj.offset, obj.end)
            out[b, :, s : s + len(block)] = queries[:, sl] @ block[:, sl].T
    return out


def truth_topk(
    block_scores: np.ndarray,
    *,
    corpus: np.ndarray,
    queries: np.ndarray,
    w: np.ndarray,
    layout: SubspaceLayout,
    k: int,
    margin: int = 100,
) -> np.ndarray:
    """The exact top ``k``: the weighted sum of the per-block cosines picks ``k + margin``
    candidates, re-scored in float64 and ordered (score desc, row asc)."""
    total = np.tensordot(w.astype(np.float32), block_scores, axes=1)  # (nq, N)
    cand = np.argpartition(-total, k + margin, axis=1)[:, : k + margin]
    scaled = queries.astype(np.float64) * layout.expand(w)
    exact = np.einsum("qd,qcd->qc", scaled, corpus[cand].astype(np.float64))
    order = np.lexsort((cand, -exact), axis=-1)[:, :k]
    return np.take_along_axis(cand, order, 1)


def ms_per_query(fn: Any, batches: list[Any]) -> float:
    t0 = time.perf_counter()
    nq = 0
    for b in batches:
        fn(*b)
        nq += len(b[0])
    return (time.perf_counter() - t0) / nq * 1e3


def build_ivf(
    args: argparse.Namespace, corpus: np.ndarray, layout: SubspaceLayout, cache: Path | None
) -> tuple[Any, float]:
    """The ivf index (read from ``cache`` when it fits, else built and saved there) and its build seconds."""
    groups = (
        None
        if args.groups is None
        else tuple(tuple(layout.names) if g == "all" else tuple(g.split(",")) for g in args.groups)
    )
    params = IvfParams(groups=groups, nlist=args.nlist, list_dtype=args.list_dtype, seed=args.seed)
    t0 = time.perf_counter()
    index = None
    if cache is not None and (cache / "ivf" / "ivf.json").is_file():
        try:
            index = load_index(cache / "ivf", corpus, layout)
            progress(f"ivf index read from {args.cache} (built in {index.report.get('build_seconds')}s)")
        except IvfIndexError as exc:
            progress(f"cached index not used: {exc}")
    if index is None:
        index = build_index(corpus, layout, params)
        if cache is not None:
            save_index(index, cache / "ivf", corpus)
    build_s = float(index.report.get("build_seconds", time.perf_counter() - t0))
    progress(f"ivf built in {build_s:.1f}s, {index.nbytes / 2**20:.0f} MiB")
    return index, build_s


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import faiss

    from esp_retrieval.encoder.query_encoder import QueryEncoder

    bundle = read_bundle(args.bundle)
    layout, K = bundle.layout, len(bundle.layout)
    dims = dict(zip(layout.names, layout.dims, strict=True))
    progress(f"bundle {bundle.version}: {len(bundle.ids)} docs, layout {dims}")
    corpus, perturb = synthetic_corpus(bundle.embeddings, layout, args.n, args.alpha, args.seed)
    texts = read_queries(Path(args.data))
    assert bundle.encoder_dir is not None, "the bundle has no query encoder"
    enc = QueryEncoder.load(bundle.encoder_dir)
    queries = normalize_blocks(np.asarray(enc.encode(texts), np.float32), layout)
    nq = len(queries)
    weights = simplex_grid(K, args.grid)
    progress(f"N={args.n}, {nq} queries, {len(weights)} weight vectors")

    threads = os.cpu_count() or 1
    faiss.omp_set_num_threads(threads)
    exact = NumpyBackend(corpus, layout)
    cache = Path(args.cache) if args.cache else None
    budgets = sorted(args.max_touched)
    index, build_s = build_ivf(args, corpus, layout, cache) if budgets else (None, None)
    engines = {
        b: IvfBackend(
            corpus,
            layout,
            index=index,
            max_touched=b,
            target_misses=args.target_misses,
            exact_below=args.exact_below,
        )
        for b in budgets
    }
    nlist = None if index is None else index.partitions[0].nlist  # faiss IVF-Flat takes the same
    pq_engines: dict[int, PqScreenBackend] = {}
    pq_build = None
    for screen in sorted(args.pq_screens):
        first = next(iter(pq_engines.values()), None)
        pq_engines[screen] = PqScreenBackend(
            corpus,
            layout,
            screen=screen,
            dsub=args.pq_dsub,
            exact_below=args.exact_below,
            seed=args.seed,
            posting_density=args.pq_posting_density,
        ) if first is None else first.with_screen(screen)
        pq_build = pq_engines[screen].build_seconds if pq_build is None else pq_build
    if pq_engines:
        progress(f"pq screen built in {pq_build:.1f}s")

    def cached(name: str, make: Any) -> tuple[Any, float]:
        """A faiss index from the cache (same corpus: the seeded synthetic rows), else built."""
        path = None if cache is None else cache / f"{name}-{args.n}-{args.seed}-{nlist}.faiss"
        if path is not None and path.is_file():
            meta = json.loads(path.with_suffix(".json").read_text())
            return faiss.read_index(str(path)), float(meta["seconds"])
        t0 = time.perf_counter()
        built = make()
        seconds = time.perf_counter() - t0
        if path is not None:
            faiss.write_index(built, str(path))
            path.with_suffix(".json").write_text(json.dumps({"seconds": seconds}))
        progress(f"{name} built in {seconds:.1f}s")
        return built, seconds

    def make_ivf_flat() -> Any:
        assert nlist is not None  # built only beside the ivf index
        idx = faiss.IndexIVFFlat(faiss.IndexFlatIP(layout.dim), layout.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rows = np.random.default_rng(args.seed).choice(args.n, min(args.n, 48 * nlist), replace=False)
        idx.train(corpus[np.sort(rows)])
        idx.add(corpus)
        return idx

    def make_hnsw() -> Any:
        idx = faiss.IndexHNSWFlat(layout.dim, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = 40
        idx.add(corpus)
        return idx

    fivf: Any = None
    fivf_build = None
    if budgets:
        fivf, fivf_build = cached("faiss_ivf", make_ivf_flat)
    hnsw, hnsw_build = cached("hnsw", make_hnsw) if not args.no_hnsw else (None, None)

    block_scores = block_score_matrices(queries, corpus, layout)
    check = exact.search(queries, weights[len(weights) // 2], args.k).rows
    mid = truth_topk(
        block_scores, corpus=corpus, queries=queries, w=weights[len(weights) // 2], layout=layout, k=args.k
    )
    truth_agrees = float((check == mid).mean())  # the truth shortcut against the exact engine
    rows: list[dict[str, Any]] = []
    tq = min(args.time_queries, nq)
    for w in weights:
        truth = truth_topk(block_scores, corpus=corpus, queries=queries, w=w, layout=layout, k=args.k)
        scaled = np.ascontiguousarray((queries * layout.expand(w)).astype(np.float32))
        row: dict[str, Any] = {"weights": dict(zip(layout.names, w.round(3).tolist(), strict=True))}
        row["ivf"], row["faiss_ivf"] = {}, {}
        for b, ivf in engines.items():
            res = ivf.search(queries, w, args.k)
            st = ivf.last_stats
            assert st is not None
            rec = recall(res.rows, truth)
            row["ivf"][f"budget{b}"] = {
                "recall_mean": float(rec.mean()),
                "recall_min": float(rec.min()),
                "touched_mean": float(st.touched.mean() / args.n),
                "touched_max": float(st.touched.max() / args.n),
                "exact_share": float(st.exact.mean()),
                "mode": st.mode,
                "ms_b1": ms_per_query(ivf.search, [(queries[i : i + 1], w, args.k) for i in range(tq)]),
                "ms_b64": ms_per_query(ivf.search, [(queries[:64], w, args.k)]),
            }
            fivf.nprobe = max(1, round(b * nlist))  # the same work: as many lists of the same size
            _, lab = fivf.search(scaled, args.k)
            frec = recall(lab, truth)
            row["faiss_ivf"][f"budget{b}"] = {
                "recall_mean": float(frec.mean()),
                "recall_min": float(frec.min()),
            }
            progress(
                f"w={w.round(2).tolist()} budget {b}: ivf {rec.mean():.4f} faiss IVF-Flat {frec.mean():.4f}"
            )
        row["pq"] = {}
        for screen, pq in pq_engines.items():
            rec = recall(pq.search(queries, w, args.k).rows, truth)
            row["pq"][f"screen{screen}"] = {
                "recall_mean": float(rec.mean()),
                "recall_min": float(rec.min()),
                "mode": "exact" if pq.fallback else "pq",
                "ms_b1": ms_per_query(pq.search, [(queries[i : i + 1], w, args.k) for i in range(tq)]),
                "ms_b64": ms_per_query(pq.search, [(queries[:64], w, args.k)]),
            }
            progress(f"w={w.round(2).tolist()} pq screen {screen}: {rec.mean():.4f}")
        if hnsw is not None:
            row["hnsw"] = {}
            for ef in args.hnsw_ef:
                hnsw.hnsw.efSearch = ef
                stats: Any = getattr(faiss.cvar, "hnsw_stats")  # noqa: B009 - untyped swig module
                stats.reset()
                _, lab = hnsw.search(scaled, args.k)
                hrec = recall(lab, truth)
                row["hnsw"][f"ef{ef}"] = {
                    "recall_mean": float(hrec.mean()),
                    "recall_min": float(hrec.min()),
                    "touched_mean": float(stats.ndis / nq / args.n),
                }
        row["_scaled"] = scaled
        rows.append(row)

    # timing anchors: the exact scan (weights do not change its work), faiss at batch 1
    ex_w = weights[np.linspace(0, len(weights) - 1, args.exact_weights).astype(int)]
    exact_b1 = float(
        np.mean(
            [ms_per_query(exact.search, [(queries[i : i + 1], w, args.k) for i in range(tq)]) for w in ex_w]
        )
    )
    exact_b64 = float(np.mean([ms_per_query(exact.search, [(queries[:64], w, args.k)]) for w in ex_w]))
    s0 = rows[len(rows) // 2]["_scaled"]
    faiss_b1 = None
    if fivf is not None:
        fivf.nprobe = max(1, round(budgets[-1] * nlist))
        faiss_b1 = ms_per_query(lambda x: fivf.search(x, args.k), [(s0[i : i + 1],) for i in range(tq)])
    hnsw_b1 = None
    if hnsw is not None:
        hnsw.hnsw.efSearch = args.hnsw_ef[-1]
        hnsw_b1 = ms_per_query(lambda x: hnsw.search(x, args.k), [(s0[i : i + 1],) for i in range(tq)])
    for r in rows:
        del r["_scaled"]

    def summarise(prefix: str, cells: list[dict[str, Any]]) -> dict[str, Any]:
        """One engine setting over every weight vector: worst and mean recall, ms, speed-ups."""
        worst = min(range(len(rows)), key=lambda i: cells[i]["recall_mean"])
        b1 = np.array([c["ms_b1"] for c in cells])
        b64 = np.array([c["ms_b64"] for c in cells])
        return {
            f"{prefix}_worst_recall": cells[worst]["recall_mean"],
            f"{prefix}_worst_weights": rows[worst]["weights"],
            f"{prefix}_mean_recall": float(np.mean([c["recall_mean"] for c in cells])),
            f"{prefix}_worst_query_recall": min(c["recall_min"] for c in cells),
            f"{prefix}_modes": sorted({c["mode"] for c in cells}),  # "exact": the fallback answered
            "ms_b1_mean": float(b1.mean()),
            "ms_b1_worst_weight": float(b1.max()),
            "ms_b64_mean": float(b64.mean()),
            "speedup_b1_vs_exact": exact_b1 / float(b1.mean()),
            "speedup_b1_vs_exact_worst_weight": exact_b1 / float(b1.max()),
            "speedup_b64_vs_exact": exact_b64 / float(b64.mean()),
        }

    per_budget: dict[str, Any] = {}
    for b in budgets:
        key = f"budget{b}"
        cells = [r["ivf"][key] for r in rows]
        per_budget[key] = {
            **summarise("ivf", cells),
            "ivf_touched_mean": float(np.mean([c["touched_mean"] for c in cells])),
            "ivf_touched_max_query": max(c["touched_max"] for c in cells),
            "ivf_exact_share": float(np.mean([c["exact_share"] for c in cells])),
            "faiss_ivf_worst_recall": min(r["faiss_ivf"][key]["recall_mean"] for r in rows),
            "faiss_ivf_mean_recall": float(np.mean([r["faiss_ivf"][key]["recall_mean"] for r in rows])),
        }
    per_screen = {f"screen{s}": summarise("pq", [r["pq"][f"screen{s}"] for r in rows]) for s in pq_engines}
    summary: dict[str, Any] = {
        "per_budget": per_budget,
        "per_pq_screen": per_screen,
        "ms_b1": {"exact": exact_b1, "faiss_ivf_at_largest_budget": faiss_b1, "hnsw_at_largest_ef": hnsw_b1},
        "ms_b64": {"exact": exact_b64},
    }
    if hnsw is not None:
        summary["hnsw_worst_recall"] = {
            key: min(r["hnsw"][key]["recall_mean"] for r in rows) for key in rows[0]["hnsw"]
        }
        summary["hnsw_touched_mean"] = {
            key: float(np.mean([r["hnsw"][key]["touched_mean"] for r in rows])) for key in rows[0]["hnsw"]
        }
    emit(
        {
            "bench": "ann",
            "n": args.n,
            "k": args.k,
            "layout": dict(zip(layout.names, layout.dims, strict=True)),
            "bundle": bundle.version,
            "corpus": perturb,
            "queries": {"source": list(QUERY_FILES), "count": nq},
            "grid_step": args.grid,
            "weight_vectors": len(weights),
            "settings": {
                "max_touched": args.max_touched,
                "target_misses": args.target_misses,
                "nlist": nlist,
                "list_dtype": args.list_dtype,
                "exact_below": args.exact_below,
                "partitions": None if index is None else [list(p.blocks) for p in index.partitions],
                "pq_screens": sorted(args.pq_screens),
                "pq_dsub": args.pq_dsub,
                "pq_posting_density": args.pq_posting_density,
                "pq_posted_blocks": list(next(iter(pq_engines.values())).posted) if pq_engines else None,
                "threads": threads,
            },
            "build": {
                "ivf_seconds": None if build_s is None else round(build_s, 2),
                "ivf_bytes": None if index is None else index.nbytes,
                "faiss_ivf_seconds": None if fivf_build is None else round(fivf_build, 2),
                "hnsw_seconds": None if hnsw_build is None else round(hnsw_build, 2),
                "pq_seconds": None if pq_build is None else round(pq_build, 2),
                "corpus_bytes": int(corpus.nbytes),
            },
            "truth_agrees_with_exact_engine": truth_agrees,
            "summary": summary,
            "per_weight": rows,
            "machine": machine(),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
