"""Milvus beside the in-process engine: recall@10 against the float64 exact answer and ms per query.

On clustered, block-normalised vectors (3 subspaces) and a grid of weight vectors, one run:

* ``hybrid_weighted_ranker``: Milvus' own multi-vector search, one vector field per subspace,
  ``hybrid_search`` with one ``AnnSearchRequest`` per field (``limit`` candidates each, FLAT)
  fused by ``WeightedRanker(w)``: what a Milvus user would do for per-request weights;
* ``milvus_flat``: our block-scaled query on one concatenated vector field, FLAT index, through
  the ``milvus`` backend (completeness check + exact re-rank: the exact answer);
* ``milvus_ivf_flat`` / ``milvus_autoindex`` (and ``milvus_hnsw`` on a server that has it): the
  same collection re-indexed, candidates re-ranked exactly;
* ``numpy``: the in-process backend (the anchor; ratios are against it).

Recall@10 is ``|top10 ∩ exact top10| / 10`` per query, averaged per weight vector (the JSON
gives each vector's, the worst and the mean). Milvus Lite runs in a local server process on this
machine; a Milvus cluster spreads the same work over its query nodes. ``--sizes 100000 1000000``:
the 1M run writes 2 x 1M rows into Milvus Lite (slow on a small shared CPU); it is opt-in.

Milvus Lite ignores ``nprobe`` and builds no HNSW, so approximate recall means something only
against a server (``--uri``). On a server the bench waits for each index build (a server builds
it in the background) and sweeps ``--nprobe`` (IVF_FLAT), ``--ef`` (HNSW) and ``--candidates``
(the pool re-ranked exactly). A server without a cluster, on this machine: the optional PyPI
package ``milvus`` (Milvus standalone with embedded etcd and local storage, about 57 MB; not in
requirements.txt), in a virtual environment of its own, started with
``milvus-server --data DIR`` (listens on 19530; stop it with Ctrl+C). Its 2.3 server has no
``hybrid_search`` (2.4+): pass ``--skip hybrid`` there.

``--load-baseline`` measures only the load rate, one JSON line: synthetic clustered rows of the
demo bundle's width (384 + 1024 + 32 = 1,440) with a display text each, written into the same
Milvus by the old way (per-row dicts, upserts of 2,000 rows, one at a time), by pymilvus' row
inserts at 1 MiB requests (what the request size alone gives) and by ``esp milvus-load``'s
``load_bundle`` (column-wise, vectors packed as bytes, two requests in flight); the first two
on the first ``--baseline-rows`` rows (the old way writes ~100-200 rows/s into Milvus Lite), the
last on those rows too (the ratio) and on all ``--sizes`` rows. ``--serve-lite`` runs the load
against ``esp milvus-lite`` (Milvus Lite served over TCP) started in the work folder.

Examples:  python bench/milvus.py --sizes 100000 --queries 20
           python bench/milvus.py --load-baseline --serve-lite --sizes 200000
           python bench/milvus.py --uri http://127.0.0.1:19530 --skip hybrid --nlist 1024
               --nprobe 8 16 32 64 128 --ef 64 128 256 512 --candidates 10 100 250 500 (one line)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit, progress
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

WEIGHT_GRID: list[tuple[float, float, float]] = [
    (1.0, 1.0, 1.0),
    (1.0, 0.0, 0.0),
    (0.0, 1.0, 0.0),
    (0.0, 0.0, 1.0),
    (1.0, 0.25, 0.05),
    (0.2, 1.0, 0.2),
    (0.5, 0.5, 2.0),
    (1.0, 0.6, 0.0),
]


def clustered(
    n: int,
    layout: SubspaceLayout,
    seed: int,
    *,
    centers: int = 512,
    chunk: int = 50_000,
    center_seed: int | None = None,
) -> np.ndarray:
    """Rows whose blocks each sit near one of ``centers`` directions (chosen per block, so the
    combinations vary), block-normalised: structure like real embeddings, unlike Gaussian noise.
    The directions come from ``center_seed`` (default ``seed``): rows of another seed with the
    same ``center_seed`` are new rows of the same distribution."""
    rng = np.random.default_rng(seed if center_seed is None else center_seed)
    cents = []
    for o in layout:
        c = rng.standard_normal((centers, o.dim)).astype(np.float32)
        cents.append(c / np.linalg.norm(c, axis=1, keepdims=True))
    out = np.empty((n, layout.dim), np.float32)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        r = np.random.default_rng([seed, s])
        for o, c in zip(layout, cents, strict=True):
            pick = r.integers(0, centers, e - s)
            noise = r.standard_normal((e - s, o.dim)).astype(np.float32) / np.sqrt(o.dim)
            out[s:e, o.offset : o.end] = c[pick] + 0.8 * noise
        out[s:e] = normalize_blocks(out[s:e], layout)
    return out


def recall(got: np.ndarray, exact: np.ndarray, k: int) -> float:
    return float(
        np.mean([len(set(g[:k].tolist()) & set(x[:k].tolist())) / k for g, x in zip(got, exact, strict=True)])
    )


def timed(fn: Any, queries: np.ndarray, w: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """One query per call (latency, as a request sees it): rows ``(nq, k)`` and ms per query."""
    rows = []
    t0 = time.perf_counter()
    for q in queries:
        rows.append(fn(q[None, :], w, k))
    return np.concatenate(rows), 1000.0 * (time.perf_counter() - t0) / len(queries)


def hybrid_collection(client: Any, name: str, corpus: np.ndarray, layout: SubspaceLayout, batch: int) -> None:
    from pymilvus import DataType, MilvusClient

    if client.has_collection(name):
        client.drop_collection(name)
    s = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    s.add_field("row", DataType.INT64, is_primary=True)
    params = client.prepare_index_params()
    for o in layout:
        s.add_field(f"v_{o.name}", DataType.FLOAT_VECTOR, dim=o.dim)
        params.add_index(field_name=f"v_{o.name}", index_type="FLAT", metric_type="IP")
    client.create_collection(name, schema=s, index_params=params, consistency_level="Strong")
    for b in range(0, len(corpus), batch):
        block = corpus[b : b + batch]
        rows = [
            {"row": b + i, **{f"v_{o.name}": block[i, o.offset : o.end] for o in layout}}
            for i in range(len(block))
        ]
        client.insert(name, rows)
    client.flush(name)
    client.load_collection(name)


def hybrid_search(client: Any, name: str, layout: SubspaceLayout, limit: int) -> Any:
    from pymilvus import AnnSearchRequest, WeightedRanker

    def run(q: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
        live = [(o, wk) for o, wk in zip(layout, w.tolist(), strict=True) if wk > 0]
        reqs = [
            AnnSearchRequest(
                data=[q[0, o.offset : o.end]],
                anns_field=f"v_{o.name}",
                param={"metric_type": "IP"},
                limit=limit,
            )
            for o, _ in live
        ]
        top = max(wk for _, wk in live)  # WeightedRanker takes weights in [0, 1]: the same ranking
        ranker = WeightedRanker(*[wk / top for _, wk in live])
        res = client.hybrid_search(name, reqs, ranker, limit=k)
        got = [int(h["id"]) for h in res[0]][:k]
        return np.asarray([got + [-1] * (k - len(got))], np.int64)

    return run


def run_size(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from pymilvus import MilvusClient

    from esp_retrieval.service.engine.milvus_backend import (
        MilvusBackend,
        MilvusSettings,
        batch_rows,
        load_bundle,
    )
    from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
    from esp_retrieval.subspace.filters import MetadataSchema

    layout = SubspaceLayout.from_dims(dict(zip(("semantic", "entity", "intent"), args.dims, strict=True)))
    progress(f"n={n}: data (D={layout.dim})")
    corpus = clustered(n, layout, seed=1)
    # "fresh": queries around directions of their own (no document cluster near them: the hard,
    # out-of-distribution case); "corpus": new rows around the corpus's directions (in distribution)
    queries = clustered(args.queries, layout, seed=2, center_seed=1 if args.query_centers == "corpus" else 2)
    k = 10
    numpy_engine = NumpyBackend(corpus, layout)
    exact: dict[tuple[float, ...], np.ndarray] = {}
    out: dict[str, Any] = {
        "n": n,
        "dim": layout.dim,
        "layout": dict(zip(layout.names, layout.dims, strict=True)),
    }
    methods: dict[str, dict[str, Any]] = {}

    def measure(name: str, fn: Any) -> None:
        per_w, ms = {}, []
        for w in WEIGHT_GRID:
            wv = np.asarray(w)
            rows, t = timed(fn, queries, wv, k)
            per_w[",".join(map(str, w))] = round(recall(rows, exact[w], k), 4)
            ms.append(t)
        methods[name] = {
            "recall_at_10": per_w,
            "recall_min": min(per_w.values()),
            "recall_mean": round(float(np.mean(list(per_w.values()))), 4),
            "ms_per_query": round(float(np.mean(ms)), 3),
        }
        m = methods[name]
        progress(
            f"n={n} {name}: recall min {m['recall_min']} mean {m['recall_mean']}, "
            f"{m['ms_per_query']} ms/query"
        )

    for w in WEIGHT_GRID:
        exact[w] = numpy_engine.search(
            queries, np.asarray(w), k
        ).rows  # exact float64 top k (engine contract)
    measure("numpy", lambda q, w, kk: numpy_engine.search(q, w, kk).rows)

    uri = args.uri or str(workdir / f"bench-{n}.db")
    settings = MilvusSettings(
        uri=uri,
        collection=f"esp_{n}",
        index="FLAT",
        timeout=600,
        index_wait=args.index_wait,
        consistency=args.consistency,
    )
    progress(f"n={n}: writing the concatenated collection")
    t0 = time.perf_counter()
    ids = [str(i) for i in range(n)]
    if args.uri:  # a server keeps collections between runs: FLAT first, whatever an earlier run left
        with _client(uri) as c:
            if c.has_collection(settings.collection):
                _reindex(c, settings.collection, "FLAT", {}, args.index_wait)
    load_bundle(settings, layout, corpus, ids, None, schema=MetadataSchema({}), batch=args.batch)
    out["load_seconds_concatenated"] = round(time.perf_counter() - t0, 1)
    engine = MilvusBackend(corpus, layout, settings=settings)
    measure("milvus_flat", lambda q, w, kk: engine.search(q, w, kk).rows)
    methods["milvus_flat"]["rescans"] = engine.rescans
    engine.close()

    client = MilvusClient(uri=uri, timeout=600, alias="esp-bench")
    try:
        out["server_version"] = str(client.get_server_version())
    except Exception:  # Milvus Lite does not implement it
        out["server_version"] = "milvus-lite"
    try:
        if "hybrid" in args.skip and "approx" in args.skip:
            return _finish(out, methods)
        if "hybrid" not in args.skip:
            try:
                progress(f"n={n}: writing the 3-field collection")
                t0 = time.perf_counter()
                hybrid_collection(client, f"hybrid_{n}", corpus, layout, args.batch or batch_rows(layout.dim))
                out["load_seconds_three_fields"] = round(time.perf_counter() - t0, 1)
                for limit in args.hybrid_limits:
                    measure(
                        f"hybrid_weighted_ranker_limit{limit}",
                        hybrid_search(client, f"hybrid_{n}", layout, limit),
                    )
            except Exception as exc:  # several vector fields and hybrid_search: Milvus 2.4+
                methods["hybrid_weighted_ranker"] = {"skipped": str(exc)[:200]}
                progress(f"n={n} hybrid_search: skipped ({str(exc)[:120]})")
        if "approx" in args.skip:
            return _finish(out, methods)

        for index, params in _index_grid(args):
            tag = index.lower() + (f"_nlist{params['nlist']}" if "nlist" in params else "")
            if not _reindex(client, settings.collection, index, params, args.index_wait):
                methods[f"milvus_{tag}"] = {"skipped": f"{index} is not built by this Milvus"}
                progress(f"n={n} {index}: not available here")
                continue
            if index == "IVF_FLAT":
                out.setdefault("nprobe_honoured", {})[tag] = _nprobe_honoured(
                    client, settings.collection, queries[0], params["nlist"]
                )
            for knob, cand in _knobs(index, args):
                s = settings.model_copy(update={**knob, "candidates": cand})
                approx = MilvusBackend(corpus, layout, settings=s)
                pool = approx.candidates(k)
                sp = approx.search_params(pool)["params"]
                name = f"milvus_{tag}" + "".join(f"_{a}{b}" for a, b in sp.items()) + f"_c{pool}"
                if name not in methods:
                    measure(name, lambda q, w, kk, e=approx: e.search(q, w, kk).rows)
                    methods[name]["params"] = {**params, **sp, "candidates": pool}
                approx.close()
    finally:
        client.close()
    return _finish(out, methods)


@contextmanager
def _client(uri: str) -> Iterator[Any]:
    from pymilvus import MilvusClient

    c = MilvusClient(uri=uri, timeout=600, alias=f"esp-bench-{time.monotonic_ns()}")
    try:
        yield c
    finally:
        c.close()


def _index_grid(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    grid: list[tuple[str, dict[str, Any]]] = []
    for index in args.indexes:
        if index == "IVF_FLAT":
            grid += [("IVF_FLAT", {"nlist": nl}) for nl in args.nlist]
        elif index == "HNSW":
            grid.append(("HNSW", {"M": args.hnsw_m, "efConstruction": args.ef_construction}))
        else:
            grid.append((index, {}))
    return grid


def _knobs(index: str, args: argparse.Namespace) -> list[tuple[dict[str, Any], int]]:
    """The search settings swept on one index: nprobe (IVF_FLAT) or ef (HNSW) x candidates."""
    if index == "IVF_FLAT":
        knobs: list[dict[str, Any]] = [{"nprobe": p} for p in args.nprobe]
    elif index == "HNSW":
        knobs = [{"ef": e} for e in args.ef]
    else:
        knobs = [{}]
    return [(kn, c) for kn in knobs for c in args.candidates]


def _reindex(client: Any, collection: str, index: str, params: dict[str, Any], wait: float) -> bool:
    """Replace the vector index and load the collection once the index covers every row; ``False``
    (FLAT restored) when this Milvus does not build ``index`` (Milvus Lite has no HNSW)."""
    from esp_retrieval.service.engine.milvus_backend import VECTOR, wait_for_index

    client.release_collection(collection)
    client.drop_index(collection, VECTOR)
    ip = client.prepare_index_params()
    ip.add_index(field_name=VECTOR, index_type=index, metric_type="IP", params=params)
    built = True
    t0 = time.perf_counter()  # a 2.3 server's create_index returns once the index is built
    try:
        client.create_index(collection, ip)
    except Exception:
        built = False
        ip = client.prepare_index_params()
        ip.add_index(field_name=VECTOR, index_type="FLAT", metric_type="IP")
        client.create_index(collection, ip)
    wait_for_index(client, collection, wait)
    progress(f"{collection}: {index if built else 'FLAT'} {params} built in {time.perf_counter() - t0:.1f} s")
    client.load_collection(collection)
    return built


def _nprobe_honoured(client: Any, collection: str, query: np.ndarray, nlist: int) -> bool:
    """Do nprobe 1 and nprobe = nlist give different hits? (Milvus Lite 2.5.1: the same.)"""
    from esp_retrieval.service.engine.milvus_backend import VECTOR

    hits = [
        client.search(
            collection,
            data=[query.tolist()],
            anns_field=VECTOR,
            limit=50,
            search_params={"metric_type": "IP", "params": {"nprobe": p}},
        )[0]
        for p in (1, nlist)
    ]
    return [h["id"] for h in hits[0]] != [h["id"] for h in hits[1]]


def _finish(out: dict[str, Any], methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    anchor = methods["numpy"]["ms_per_query"]
    for m in methods.values():
        if "ms_per_query" in m:
            m["ms_ratio_vs_numpy"] = round(m["ms_per_query"] / anchor, 2)
    out["methods"] = methods
    return out


DEMO_DIMS = (384, 1024, 32)  # the demo bundle's layout: semantic, lexical, intent (configs/demo.yaml)


def _old_load(
    client: Any,
    name: str,
    corpus: np.ndarray,
    ids: list[str],
    docs: list[dict[str, Any]],
    *,
    schema: Any,
    insert: bool,
    batch: int,
) -> None:
    """The load as it was (``insert=False``: upserts of per-row dicts, 2,000 rows each), or the
    same rows inserted ``batch`` at a time: one request in flight."""
    from esp_retrieval.service.engine.milvus_backend import entity

    for s in range(0, len(ids), batch):
        e = min(len(ids), s + batch)
        rows = [entity(ids[i], i, corpus[i], docs[i], schema=schema, where=f"docs[{i}]") for i in range(s, e)]
        (client.insert if insert else client.upsert)(name, rows, timeout=600)
    client.flush(name, timeout=600)


def _rate(rows: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds), **extra}


def load_rates(n: int, args: argparse.Namespace, uri: str) -> dict[str, Any]:
    """Rows per second of the three ways of loading, into the same Milvus (module docstring)."""
    from esp_retrieval.service.engine.milvus_backend import (
        MilvusSettings,
        batch_rows,
        connect,
        create_collection,
        load_bundle,
    )
    from esp_retrieval.subspace.filters import MetadataSchema

    layout = SubspaceLayout.from_dims(dict(zip(("semantic", "lexical", "intent"), args.dims, strict=True)))
    progress(f"load n={n}: data (D={layout.dim})")
    corpus = clustered(n, layout, seed=1)
    ids = [f"doc-{i}" for i in range(n)]
    docs = [{"text": f"synthetic document {i}: " + "lorem ipsum dolor sit amet " * 4} for i in range(n)]
    schema = MetadataSchema.infer(docs)
    m = min(n, args.baseline_rows)
    base = MilvusSettings(uri=uri, collection="esp_load", timeout=600, index_wait=args.index_wait)
    methods: dict[str, dict[str, Any]] = {}
    client = connect(base)
    try:
        try:
            version = str(client.get_server_version())
        except Exception:  # Milvus Lite does not implement it
            version = "milvus-lite"
        for tag, insert, rows_per_request in (
            ("old_upserts_2000", False, 2000),
            ("row_inserts_1mib", True, 0),
        ):
            size = rows_per_request or batch_rows(layout.dim)
            name = f"esp_load_{tag}"
            if client.has_collection(name):
                client.drop_collection(name)
            create_collection(
                client, base.model_copy(update={"collection": name}), layout, schema, {"esp": 1}
            )
            progress(f"load n={n}: {tag} on {m} rows")
            t0 = time.perf_counter()
            _old_load(client, name, corpus[:m], ids[:m], docs[:m], schema=schema, insert=insert, batch=size)
            methods[tag] = _rate(m, time.perf_counter() - t0, batch=size)
            client.drop_collection(name)
    finally:
        client.close()
    for tag, rows in (("esp_milvus_load", m), ("esp_milvus_load_all", n)):
        settings = base.model_copy(update={"collection": f"esp_load_{tag}"})
        progress(f"load n={n}: {tag} on {rows} rows")
        report = load_bundle(
            settings, layout, corpus[:rows], ids[:rows], docs[:rows], schema=schema, replace=True
        )
        methods[tag] = _rate(
            rows,
            report.seconds,
            batch=report.batch,
            write_seconds=round(report.write_seconds, 2),
            index_seconds=round(report.index_seconds, 2),
        )
        with _client(uri) as c:
            c.drop_collection(settings.collection)
    for tag, m_ in methods.items():
        progress(f"load n={n} {tag}: {m_['rows_per_s']} rows/s ({m_['rows']} rows)")
    old = methods["old_upserts_2000"]["rows_per_s"]
    return {
        "bench": "milvus_load",
        "n": n,
        "baseline_rows": m,
        "dim": layout.dim,
        "server_version": version,
        "methods": methods,
        "ratio_vs_old": round(methods["esp_milvus_load"]["rows_per_s"] / old, 2),
        "ratio_rows_1mib_vs_old": round(methods["row_inserts_1mib"]["rows_per_s"] / old, 2),
    }


@contextmanager
def _milvus_uri(args: argparse.Namespace, workdir: Path) -> Iterator[str | None]:
    """``--uri``, or with ``--serve-lite`` an ``esp milvus-lite`` of a file in ``workdir``."""
    if not args.serve_lite:
        yield args.uri
        return
    from bench.live_server import start_milvus_lite

    with start_milvus_lite(workdir / "bench.db", workdir / "milvus-lite.log") as server:
        yield server.url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__[__doc__.index("Milvus Lite ignores") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    p.add_argument(
        "--dims",
        type=int,
        nargs=3,
        default=None,
        help="subspace dims (default 256 96 32; with --load-baseline the demo's 384 1024 32)",
    )
    p.add_argument("--load-baseline", action="store_true", help="measure the load rate only (old vs new)")
    p.add_argument(
        "--baseline-rows", type=int, default=20_000, help="--load-baseline: rows the older ways write"
    )
    p.add_argument(
        "--serve-lite", action="store_true", help="run against esp milvus-lite started in the work folder"
    )
    p.add_argument("--queries", type=int, default=20, help="queries per weight vector")
    p.add_argument(
        "--query-centers",
        default="fresh",
        choices=["fresh", "corpus"],
        help="queries around directions of their own (default) or around the corpus's",
    )
    p.add_argument("--batch", type=int, default=None, help="rows per insert (default: 1 MiB of vectors)")
    p.add_argument(
        "--uri",
        default=None,
        help="a Milvus server (http://127.0.0.1:19530); default: Milvus Lite files in --workdir",
    )
    p.add_argument(
        "--indexes",
        nargs="+",
        default=["IVF_FLAT", "AUTOINDEX", "HNSW"],
        choices=["IVF_FLAT", "HNSW", "AUTOINDEX"],
        help="approximate indexes measured (one after the other on the same collection)",
    )
    p.add_argument("--nlist", type=int, nargs="+", default=[1024, 64], help="IVF_FLAT lists (one index each)")
    p.add_argument("--nprobe", type=int, nargs="+", default=[64], help="IVF_FLAT lists probed (swept)")
    p.add_argument("--hnsw-m", type=int, default=16, help="HNSW graph degree")
    p.add_argument("--ef-construction", type=int, default=200, help="HNSW build breadth")
    p.add_argument(
        "--ef",
        type=int,
        nargs="+",
        default=[256],
        help="HNSW search breadth (swept; at least the candidates)",
    )
    p.add_argument(
        "--consistency",
        default="Strong",
        choices=["Strong", "Session", "Bounded", "Eventually"],
        help="consistency level of the backend's searches (a server's Strong waits for a time tick)",
    )
    p.add_argument("--index-wait", type=float, default=1800.0, help="seconds to wait for an index build")
    p.add_argument("--skip", nargs="*", default=[], choices=["hybrid", "approx"], help="leave methods out")
    p.add_argument(
        "--candidates", type=int, nargs="+", default=[100, 400], help="approximate: candidates re-ranked"
    )
    p.add_argument(
        "--hybrid-limits", type=int, nargs="+", default=[10, 100], help="per-field limit of hybrid_search"
    )
    p.add_argument(
        "--workdir", type=Path, default=None, help="where the Milvus Lite files go (default: a temp dir)"
    )
    args = p.parse_args(argv)
    if args.dims is None:
        args.dims = list(DEMO_DIMS) if args.load_baseline else [256, 96, 32]
    with tempfile.TemporaryDirectory(prefix="esp-milvus-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        with _milvus_uri(args, workdir) as uri:
            args.uri = uri
            if args.load_baseline:
                for n in args.sizes:
                    out = load_rates(n, args, uri or str(workdir / f"load-{n}.db"))
                    emit(
                        {**out, "milvus": "esp milvus-lite" if args.serve_lite else uri or "Milvus Lite file"}
                    )
                return 0
            runs = [run_size(n, args, workdir) for n in args.sizes]
    emit(
        {
            "bench": "milvus",
            "k": 10,
            "queries_per_weight": args.queries,
            "query_centers": args.query_centers,
            "weights": [list(w) for w in WEIGHT_GRID],
            "runs": runs,
            "milvus": args.uri or "Milvus Lite (local server process)",
            "consistency": args.consistency,
            "note": "ms are one query per call, on this machine",
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
