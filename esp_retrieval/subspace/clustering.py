"""Keyword clustering on the weighted subspace similarity (torch-free core).

"Similar" means what search means (docs/architecture.md section 1): for block-normalised vectors and block
weights ``w_k >= 0``, ``s(a, b) = sum_k w_k <a_k, b_k>``. Clustering uses the distance

    d(a, b) = 1 - s(a, b) / W,        W = sum_k w_k,     d in [0, 2]

so ``threshold`` means the same thing at every weight setting (0 = identical in every weighted
block). With ``x' = sqrt(w) * x`` (per block) ``<a', b'> = s(a, b)`` and ``||x'||^2 = W``, so
``d`` is the cosine distance of the scaled vectors and ``||a' - b'||^2 = 2 W d``: every method
here works on the scaled vectors and never loops over blocks.

Methods (registry :data:`METHODS`, params as kwargs):

- ``agglomerative`` (average linkage by default, cut at ``threshold``): exact on a condensed
  distance matrix (scipy) while that fits ``dense_limit_mb``; above it, merges are restricted to
  clusters joined in the ``knn`` nearest-neighbour graph, with exact average distances kept
  from per-cluster vector sums (:func:`graph_average_linkage`; memory ``O(n (D + knn))``).
  ``complete``/``single`` linkage above the limit use scikit-learn's connectivity-constrained
  version, whose cluster distances are taken over graph edges only.
- ``hdbscan`` (Campello et al. 2013, scikit-learn): exact on a dense distance matrix while that
  fits; above it, on the sparse ``knn`` graph (core distances exact for ``knn >= min_samples``,
  the spanning tree restricted to the graph). Noise is label ``-1``.

``dense_limit_mb`` (default 512) puts the switch at about 8,000 keywords for agglomerative and
4,000 for HDBSCAN; the graph paths keep 50,000 keywords under ~1 GB.

Every cluster's label is its most central keyword: the member with the highest mean weighted
similarity to the cluster, found in ``O(n D)`` because ``s`` is bilinear
(``sum_j s(i, j) = <x'_i, sum_j x'_j>``).
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Protocol

import numpy as np

from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.metrics import adjusted_rand, normalized_mutual_info, purity
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.subspace.weights import resolve_block_weights

__all__ = [
    "METHODS",
    "Agglomerative",
    "ClusterResult",
    "ClusteringError",
    "Hdbscan",
    "KeywordClusters",
    "KeywordEncoder",
    "cluster_embeddings",
    "cluster_keywords",
    "cluster_scores",
    "dedupe_keywords",
    "encode_batched",
    "graph_average_linkage",
    "knn_graph",
    "make_method",
    "method_params",
    "normalize_keyword",
    "scaled_vectors",
]

log = logging.getLogger(__name__)

_CHUNK_ROWS = 1024


class ClusteringError(FieldError):
    """Bad clustering input or parameters; ``field`` names the offending option."""


# --- the weighted geometry ----------------------------------------------------------------


def scaled_vectors(emb: np.ndarray, layout: SubspaceLayout, block_weights: np.ndarray) -> np.ndarray:
    """``(n, D)`` block-normalised embeddings -> float32 ``sqrt(w)``-scaled copies.

    Dot products of the result are the weighted scores ``s``; the embeddings are re-normalised
    per block first so that a caller's rounding (float16 bundles) does not skew distances.
    """
    x = np.asarray(emb)
    if x.ndim != 2 or x.shape[1] != layout.dim:
        raise ClusteringError(f"embeddings must be (n, {layout.dim}), got shape {x.shape}", "embeddings")
    w = np.asarray(block_weights, dtype=np.float64)
    if w.shape != (len(layout),):
        raise ClusteringError(f"block_weights must have {len(layout)} values, got {w.shape}", "weights")
    x = normalize_blocks(x.astype(np.float32, copy=False), layout)
    return (x * layout.expand(np.sqrt(w)).astype(np.float32)).astype(np.float32, copy=False)


def _condensed_distances(x: np.ndarray, weight_sum: float) -> np.ndarray:
    """``scipy``'s condensed ``(n (n-1) / 2,)`` float64 distances ``1 - s / W``, built by row blocks."""
    n = x.shape[0]
    out = np.empty(n * (n - 1) // 2, dtype=np.float64)
    pos, step = 0, _chunk_rows(n)
    for i0 in range(0, n, step):
        block = x[i0 : i0 + step] @ x[i0:].T  # only the upper triangle's columns
        for r in range(block.shape[0]):
            m = n - (i0 + r) - 1
            out[pos : pos + m] = block[r, r + 1 :]
            pos += m
    out *= -1.0 / weight_sum
    out += 1.0
    np.clip(out, 0.0, 2.0, out=out)
    return out


def _chunk_rows(n: int) -> int:
    """Rows per GEMM block so a block's scores and argpartition output stay ~64 MiB."""
    return int(min(_CHUNK_ROWS, max(16, (1 << 22) // max(n, 1))))


def knn_graph(x: np.ndarray, weight_sum: float, k: int) -> Any:
    """Symmetric sparse CSR graph of each row's ``k`` nearest neighbours (self excluded),
    values = distances ``1 - s / W`` floored at a tiny positive number (an explicit 0 would read
    as "no edge"). Memory ``O(n k)`` plus one ~64 MiB block; time one chunked GEMM pass."""
    from scipy.sparse import coo_matrix

    n = x.shape[0]
    k = min(k, n - 1)
    step = _chunk_rows(n)
    rows, cols, vals = [], [], []
    for i0 in range(0, n, step):
        sims = x[i0 : i0 + step] @ x.T
        r = np.arange(sims.shape[0])
        sims[r, i0 + r] = -np.inf  # exclude self
        part = np.argpartition(sims, n - k, axis=1)[:, n - k :]  # the k largest, unordered
        rows.append(np.repeat(i0 + r, k))
        cols.append(part.reshape(-1))
        vals.append(np.take_along_axis(sims, part, axis=1).reshape(-1))
        del sims, part
    d = 1.0 - np.concatenate(vals).astype(np.float64) / weight_sum
    d = np.clip(d, 1e-12, 2.0)
    g = coo_matrix((d, (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)).tocsr()
    return g.maximum(g.T).tocsr()  # symmetric: keep an edge found from either end


def paired_dots(a: np.ndarray, rows_a: np.ndarray, b: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
    """``<a[rows_a[i]], b[rows_b[i]]>`` for every ``i``, gathered in blocks: gathering all rows at
    once would cost two ``(len(rows), D)`` copies."""
    out = np.empty(len(rows_a), dtype=np.result_type(a, b))
    for e0 in range(0, len(rows_a), 8192):
        sl = slice(e0, e0 + 8192)
        out[sl] = np.einsum("ij,ij->i", a[rows_a[sl]], b[rows_b[sl]])
    return out


def graph_average_linkage(x: np.ndarray, weight_sum: float, graph: Any, threshold: float) -> np.ndarray:
    """Average-linkage clusters cut at ``threshold``, merges restricted to clusters joined by an
    edge of ``graph`` but with *exact* average distances.

    The similarity is bilinear, so the mean over all pairs of clusters ``A`` and ``B`` is
    ``<S_A, S_B> / (|A| |B|)`` with ``S`` the sum of a cluster's scaled vectors: keeping one sum
    per cluster (``O(n D)`` memory) gives the same merge distance as a full matrix. The only
    approximation is that clusters with no graph edge between them never merge. Edges above
    ``threshold`` never enter the heap; a merged cluster keeps the id of the side with more
    neighbours, so neighbour bookkeeping stays ``O(E log n)``.
    """
    import heapq

    n = x.shape[0]
    sums = x.astype(np.float64)
    size = np.ones(n, dtype=np.float64)
    version = [0] * n  # python lists: the loop reads single entries, cheaper than numpy scalars
    parent = list(range(n))
    g = graph.tocsr()
    nbrs = [set(g.indices[g.indptr[i] : g.indptr[i + 1]].tolist()) - {i} for i in range(n)]
    coo = g.tocoo()
    upper = coo.row < coo.col
    rows, cols = coo.row[upper], coo.col[upper]
    exact = 1.0 - paired_dots(sums, rows, sums, cols) / weight_sum
    keep = exact <= threshold
    heap: list[tuple[float, int, int, int, int]] = [
        (d, a, b, 0, 0)
        for d, a, b in zip(exact[keep].tolist(), rows[keep].tolist(), cols[keep].tolist(), strict=True)
    ]
    heapq.heapify(heap)
    while heap:
        _, a, b, va, vb = heapq.heappop(heap)
        if parent[a] != a or parent[b] != b or version[a] != va or version[b] != vb:
            continue  # stale: one side has merged since this entry was pushed
        if len(nbrs[a]) < len(nbrs[b]):
            a, b = b, a
        parent[b] = a
        sums[a] += sums[b]
        size[a] += size[b]
        version[a] += 1
        nb_a, nb_b = nbrs[a], nbrs[b]
        nb_a |= nb_b
        nb_a.discard(a)
        nb_a.discard(b)
        for c in nb_b:
            nbrs[c].discard(b)
            if c != a:
                nbrs[c].add(a)
        nbrs[b] = set()
        if not nb_a:
            continue
        cand = np.fromiter(nb_a, dtype=np.int64, count=len(nb_a))
        d = 1.0 - (sums[cand] @ sums[a]) / (size[cand] * size[a] * weight_sum)
        close = d <= threshold
        va = version[a]
        for c, dc in zip(cand[close].tolist(), d[close].tolist(), strict=True):
            heapq.heappush(heap, (dc, a, c, va, version[c]))
    root = np.asarray(parent, dtype=np.int64)
    while True:  # follow parents to each item's final cluster
        grand = root[root]
        if np.array_equal(grand, root):
            return root
        root = grand


# --- methods (registry) -------------------------------------------------------------------


@dataclass(frozen=True)
class _Method:
    """Base: parameters are dataclass fields, validated in ``__post_init__``."""

    dense_limit_mb: float = 512.0
    knn: int = 15

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _check_number(self.dense_limit_mb, "dense_limit_mb", low=0.0)
        _check_int(self.knn, "knn", low=2)

    def dense_bytes(self, n: int) -> float:  # pragma: no cover - overridden
        raise NotImplementedError

    def fits_dense(self, n: int) -> bool:
        return self.dense_bytes(n) <= self.dense_limit_mb * 2**20

    def fit(self, x: np.ndarray, weight_sum: float) -> np.ndarray:  # pragma: no cover
        """``x``: scaled vectors ``(n, D)``; returns labels ``(n,)``, ``-1`` for noise."""
        raise NotImplementedError


@dataclass(frozen=True)
class Agglomerative(_Method):
    """Hierarchical clustering cut where the linkage distance exceeds ``threshold``."""

    threshold: float = 0.4
    linkage: str = "average"

    name: ClassVar[str] = "agglomerative"
    LINKAGES: ClassVar[tuple[str, ...]] = ("average", "complete", "single")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_number(self.threshold, "threshold", low=0.0, high=2.0)
        if self.linkage not in self.LINKAGES:
            raise ClusteringError(
                f"linkage must be one of {list(self.LINKAGES)}, got {self.linkage!r}", "linkage"
            )

    def dense_bytes(self, n: int) -> float:
        return 8.0 * n * n  # condensed float64 (4 n^2) + scipy's working copy

    def fit(self, x: np.ndarray, weight_sum: float) -> np.ndarray:
        n = x.shape[0]
        if n == 1:
            return np.zeros(1, dtype=np.int64)
        if self.fits_dense(n):
            from scipy.cluster.hierarchy import fcluster, linkage

            log.info("agglomerative: %d keywords, exact %s linkage on all pairs", n, self.linkage)

            z = linkage(_condensed_distances(x, weight_sum), method=self.linkage)
            return fcluster(z, t=self.threshold, criterion="distance").astype(np.int64) - 1
        log.info("agglomerative: %d keywords exceed dense_limit_mb; using the %d-NN graph", n, self.knn)
        graph = knn_graph(x, weight_sum, self.knn)
        if self.linkage == "average":
            return graph_average_linkage(x, weight_sum, graph, self.threshold)
        from sklearn.cluster import AgglomerativeClustering

        model = AgglomerativeClustering(
            n_clusters=None,
            distance_threshold=self.threshold,
            metric="cosine",  # = 1 - s / W on the scaled vectors
            linkage=self.linkage,
            connectivity=graph,
            compute_full_tree=True,
        )
        with warnings.catch_warnings():
            # a disconnected kNN graph is completed by scikit-learn; that is expected here
            warnings.filterwarnings("ignore", message=".*connected components.*")
            return model.fit_predict(x).astype(np.int64)


@dataclass(frozen=True)
class Hdbscan(_Method):
    """Density-based clusters of at least ``min_cluster_size`` keywords; the rest is noise."""

    min_cluster_size: int = 3
    min_samples: int | None = None
    cluster_selection_method: str = "eom"

    name: ClassVar[str] = "hdbscan"
    SELECTIONS: ClassVar[tuple[str, ...]] = ("eom", "leaf")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int(self.min_cluster_size, "min_cluster_size", low=2)
        if self.min_samples is not None:
            _check_int(self.min_samples, "min_samples", low=1)
        if self.cluster_selection_method not in self.SELECTIONS:
            raise ClusteringError(
                f"cluster_selection_method must be one of {list(self.SELECTIONS)}, "
                f"got {self.cluster_selection_method!r}",
                "cluster_selection_method",
            )

    def dense_bytes(self, n: int) -> float:
        return 32.0 * n * n  # square float64 + scikit-learn's symmetry check temporaries

    def fit(self, x: np.ndarray, weight_sum: float) -> np.ndarray:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components
        from scipy.spatial.distance import squareform
        from sklearn.cluster import HDBSCAN

        n = x.shape[0]
        min_samples = min(self.min_samples or self.min_cluster_size, n - 1) if n > 1 else 1
        if n < self.min_cluster_size or n < 2:
            return np.full(n, -1, dtype=np.int64)
        model = HDBSCAN(
            min_cluster_size=self.min_cluster_size,
            min_samples=min_samples,
            metric="precomputed",
            cluster_selection_method=self.cluster_selection_method,
            copy=False,
        )
        if self.fits_dense(n):
            log.info("hdbscan: %d keywords, exact on the full distance matrix", n)
            return model.fit_predict(squareform(_condensed_distances(x, weight_sum))).astype(np.int64)
        log.info("hdbscan: %d keywords exceed dense_limit_mb; using the %d-NN graph", n, self.knn)
        graph = knn_graph(x, weight_sum, max(self.knn, min_samples))
        graph.setdiag(1e-12)  # scikit-learn counts the point itself among its min_samples
        n_comp, comp = connected_components(graph, directed=False)
        if n_comp > 1:
            # scikit-learn refuses a disconnected graph: join the components by edges at the
            # largest possible distance, so they merge only at the root of the hierarchy.
            _, reps = np.unique(comp, return_index=True)
            a, b = reps[:-1], reps[1:]  # a chain through one member of each component
            bridge = coo_matrix((np.full(2 * len(a), 2.0), (np.r_[a, b], np.r_[b, a])), shape=(n, n))
            graph = (graph + bridge).tocsr()
        return model.fit_predict(graph.tocsr()).astype(np.int64)


#: method name -> class; adding a method is one class and one line here.
METHODS: dict[str, type[_Method]] = {
    Agglomerative.name: Agglomerative,
    Hdbscan.name: Hdbscan,
}


def make_method(name: str, **params: Any) -> _Method:
    """Build a method from its registry name and keyword parameters; unknown names or
    parameters raise :class:`ClusteringError` listing the allowed ones."""
    if name not in METHODS:
        raise ClusteringError(f"method must be one of {sorted(METHODS)}, got {name!r}", "method")
    cls = METHODS[name]
    allowed = [f.name for f in fields(cls)]
    for key in params:
        if key not in allowed:
            raise ClusteringError(
                f"{key!r} is not a parameter of method {name!r}; it takes {sorted(allowed)}", key
            )
    return cls(**params)


def method_params(method: _Method) -> dict[str, Any]:
    """The method's parameters as a plain dict (what a response reports as used)."""
    return asdict(method)


def _check_number(value: Any, name: str, low: float, high: float | None = None) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ClusteringError(f"{name} must be a number {allowed}, got {value!r}", name)


def _check_int(value: Any, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ClusteringError(f"{name} must be an integer >= {low}, got {value!r}", name)


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterResult:
    """Clusters of ``n`` items.

    ``labels (n,)``: cluster id per item, ``0..C-1`` by decreasing size (ties: earliest first
    member), ``-1`` = noise. ``label_index (C,)``: row of each cluster's most central item.
    ``similarity (n,)``: ``s(item, its label) / W`` in ``[-1, 1]`` (1 for the label itself),
    NaN for noise. ``block_weights (K,)`` and ``params`` record what was used.
    """

    labels: np.ndarray
    label_index: np.ndarray
    similarity: np.ndarray
    block_weights: np.ndarray
    method: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def n_clusters(self) -> int:
        return len(self.label_index)

    @property
    def sizes(self) -> np.ndarray:
        """``(C,)`` members per cluster."""
        return np.bincount(self.labels[self.labels >= 0], minlength=self.n_clusters)

    @property
    def n_noise(self) -> int:
        return int((self.labels < 0).sum())


def _relabel_by_size(raw: np.ndarray) -> np.ndarray:
    """Map arbitrary cluster ids to ``0..C-1`` by decreasing size, then first occurrence."""
    out = np.full(raw.shape, -1, dtype=np.int64)
    keep = raw >= 0
    if not keep.any():
        return out
    ids, first, inverse, counts = np.unique(
        raw[keep], return_index=True, return_inverse=True, return_counts=True
    )
    first_row = np.flatnonzero(keep)[first]
    order = np.lexsort((first_row, -counts))  # rank of each unique id
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids))
    out[keep] = rank[inverse]
    return out


def _centres(x: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """Row of the member with the highest summed similarity to its cluster, ``(C,)``.

    ``sum_j s(i, j) = <x_i, sum_j x_j>`` (bilinear), so one sparse sum and one row-wise dot
    product give every member's centrality. Ties go to the earlier row.
    """
    from scipy.sparse import csr_matrix

    members = np.flatnonzero(labels >= 0)
    lab = labels[members]
    onehot = csr_matrix((np.ones(len(members), np.float32), (lab, members)), shape=(n_clusters, len(labels)))
    sums = np.asarray(onehot @ x, dtype=np.float32)  # (C, D)
    centrality = paired_dots(x, members, sums, lab)
    order = np.lexsort((members, -centrality, lab))  # by cluster, best first, earliest on ties
    lab_sorted = lab[order]
    first = np.flatnonzero(np.r_[True, lab_sorted[1:] != lab_sorted[:-1]])
    return members[order[first]].astype(np.int64)


def cluster_embeddings(
    emb: np.ndarray,
    layout: SubspaceLayout,
    block_weights: np.ndarray | Mapping[str, float] | Sequence[float] | None = None,
    method: str = "agglomerative",
    **params: Any,
) -> ClusterResult:
    """Cluster ``(n, D)`` block-normalised embeddings on the weighted similarity.

    ``block_weights``: ``(K,)`` in layout order, a ``{name: weight}`` dict (missing names take
    the layout defaults) or ``None`` (layout defaults); bad weights raise
    :class:`esp_retrieval.subspace.weights.WeightError`. ``params`` go to the method, e.g. ``threshold=0.4``
    (agglomerative) or ``min_cluster_size=3`` (hdbscan).
    """
    algo = make_method(method, **params)
    if len(emb) == 0:
        raise ClusteringError("nothing to cluster: no keywords", "keywords")
    if isinstance(block_weights, np.ndarray):
        w = resolve_block_weights(block_weights.tolist(), layout)
    else:
        w = resolve_block_weights(block_weights, layout)
    # s / W does not change with the weights' scale: clustered with the largest weight 1, so
    # that sqrt(w) cannot underflow float32 (1e-300 made every vector 0 and every similarity NaN)
    unit = w / w.max()
    x = scaled_vectors(emb, layout, unit)
    n = x.shape[0]
    weight_sum = float(unit.sum())
    labels = _relabel_by_size(algo.fit(x, weight_sum))
    n_clusters = int(labels.max()) + 1 if (labels >= 0).any() else 0
    centres = _centres(x, labels, n_clusters) if n_clusters else np.zeros(0, dtype=np.int64)
    sim = np.full(n, np.nan, dtype=np.float32)
    members = labels >= 0
    rows = np.flatnonzero(members)
    sim[members] = paired_dots(x, rows, x, centres[labels[rows]]) / weight_sum
    np.clip(sim, -1.0, 1.0, out=sim)
    return ClusterResult(labels, centres, sim, w, algo.name, method_params(algo))


# --- keywords -----------------------------------------------------------------------------

_SPACE = re.compile(r"\s+")


def normalize_keyword(text: str) -> str:
    """The duplicate key: Unicode NFKC, case-folded, whitespace collapsed and stripped."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def dedupe_keywords(texts: Sequence[str]) -> tuple[list[str], list[tuple[int, int]]]:
    """Keep the first spelling of each normalised keyword.

    Returns ``(unique, merged)``: the kept keywords (whitespace-stripped, input order) and
    ``(position, position of the kept spelling)`` for every dropped duplicate (0-based input
    positions). Blank entries raise :class:`ClusteringError` naming the position.
    """
    seen: dict[str, int] = {}
    unique: list[str] = []
    merged: list[tuple[int, int]] = []
    for pos, text in enumerate(texts):
        key = normalize_keyword(text)
        if not key:
            raise ClusteringError(f"keywords[{pos}] is blank", f"keywords[{pos}]")
        if key in seen:
            merged.append((pos, seen[key]))
        else:
            seen[key] = pos
            unique.append(_SPACE.sub(" ", text).strip())
    return unique, merged


class KeywordEncoder(Protocol):
    """What clustering needs from ``encoder.query_encoder.QueryEncoder`` (duck-typed, torch-free)."""

    @property
    def intent_classes(self) -> list[str] | None: ...

    def encode(self, texts: list[str]) -> np.ndarray: ...

    def intent_probs(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class KeywordClusters:
    """Clusters of keywords with the intent head's prediction per keyword.

    ``intent``/``intent_probability`` are ``None`` when the encoder has no intent head.
    """

    keywords: list[str]
    result: ClusterResult
    intent: list[str] | None
    intent_probability: np.ndarray | None

    def rows(self) -> list[dict[str, Any]]:
        """One dict per keyword, in input order: the CSV / response row."""
        res, out = self.result, []
        for i, kw in enumerate(self.keywords):
            c = int(res.labels[i])
            out.append(
                {
                    "keyword": kw,
                    "cluster_id": c,
                    "cluster_label": self.keywords[res.label_index[c]] if c >= 0 else None,
                    "intent": self.intent[i] if self.intent is not None else None,
                    "intent_probability": (
                        float(self.intent_probability[i]) if self.intent_probability is not None else None
                    ),
                    "similarity_to_label": float(res.similarity[i]) if c >= 0 else None,
                }
            )
        return out

    def summary(self) -> list[dict[str, Any]]:
        """Per cluster: id, size, label and the mix of predicted intents (counts)."""
        res, out = self.result, []
        for c in range(res.n_clusters):
            members = np.flatnonzero(res.labels == c)
            mix: dict[str, int] = {}
            if self.intent is not None:
                for i in members:
                    mix[self.intent[i]] = mix.get(self.intent[i], 0) + 1
            out.append(
                {
                    "cluster_id": c,
                    "size": len(members),
                    "label": self.keywords[res.label_index[c]],
                    "intent_mix": dict(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))),
                    "mean_similarity_to_label": float(np.mean(res.similarity[members])),
                }
            )
        return out


def encode_batched(
    encoder: KeywordEncoder,
    texts: list[str],
    batch_size: int = 256,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Embeddings ``(n, D)`` and intent probabilities ``(n, C)`` (or ``None``) in batches, so
    tens of thousands of keywords never sit in one forward pass; ``progress(done)`` per batch."""
    embs, probs = [], []
    has_intent = bool(encoder.intent_classes)
    for i0 in range(0, len(texts), batch_size):
        batch = texts[i0 : i0 + batch_size]
        embs.append(np.asarray(encoder.encode(batch), dtype=np.float32))
        if has_intent:
            probs.append(np.asarray(encoder.intent_probs(batch), dtype=np.float32))
        if progress is not None:
            progress(len(batch))
    emb = np.concatenate(embs) if embs else np.zeros((0, 0), np.float32)
    return emb, (np.concatenate(probs) if has_intent else None)


def cluster_keywords(
    encoder: KeywordEncoder,
    keywords: list[str],
    layout: SubspaceLayout,
    block_weights: np.ndarray,
    method: str = "agglomerative",
    *,
    batch_size: int = 256,
    progress: Callable[[int], None] | None = None,
    **params: Any,
) -> KeywordClusters:
    """Embed distinct ``keywords`` with the bundle's encoder and cluster them (see module doc)."""
    if not keywords:
        raise ClusteringError("nothing to cluster: no keywords", "keywords")
    algo = make_method(method, **params)  # validate before the (slow) encoding
    emb, probs = encode_batched(encoder, keywords, batch_size, progress)
    result = cluster_embeddings(emb, layout, block_weights, algo.name, **method_params(algo))
    intent, prob = None, None
    classes = encoder.intent_classes
    if probs is not None and classes:
        best = probs.argmax(axis=1)
        intent = [classes[j] for j in best]
        prob = probs[np.arange(len(best)), best]
    return KeywordClusters(list(keywords), result, intent, prob)


# --- evaluation ---------------------------------------------------------------------------


def cluster_scores(labels: np.ndarray, truth: Sequence[Any]) -> dict[str, float]:
    """Agreement of clusters with known groups: ``purity``, ``nmi``, ``ari``, ``n_clusters``,
    ``noise`` (share of unclustered items, any negative label).

    Definitions of :mod:`esp_retrieval.subspace.metrics`: purity = share of clustered items whose cluster's
    majority group is their own (noise left out); NMI and ARI count each noise item as a
    singleton cluster.
    """
    raw = np.asarray(labels, dtype=np.int64)
    if raw.shape != (len(truth),):
        raise ClusteringError(f"labels {raw.shape} and truth ({len(truth)},) differ in length", "truth")
    noise = raw < 0
    lab = np.where(noise, -1, raw)
    return {
        "purity": purity(truth, lab, noise=-1),
        "nmi": normalized_mutual_info(truth, lab, noise=-1),
        "ari": adjusted_rand(truth, lab, noise=-1),
        "n_clusters": len(np.unique(raw[~noise])),
        "noise": float(noise.mean()),
    }
