"""The engine contract: exact weighted top-k over one concatenated, block-normalised corpus.

docs/architecture.md section 1: with block-normalised rows and weights ``w_k >= 0``,
``score(q, d) = sum_k w_k <q_k, d_k> = <concat_k(w_k q_k), d>``, so a backend only ever scans
block-*scaled* queries against the unchanged corpus. Every backend follows the same recipe:

1. **scan** (backend-specific, chunked, float32 or low precision): the top ``c >= k``
   candidates per query by the scan score ``s'``, sorted, ties at the cut kept;
2. **completeness check** (here): ``|s' - s| <= eps`` is bounded from the scan's roundoff
   (``eps = rel_error * sum_k w_k |q_k| max|d_k|``). If ``s'_(c) < s'_(k) - 2 eps`` no row outside
   the candidates can reach the top k; otherwise that query is rescanned with ``4c``;
3. **exact re-rank** (here): candidates re-scored in float64 from the master corpus (the
   float32 or float16 matrix as given, e.g. memory-mapped from the bundle), ordered by
   (score desc, row asc).

So every backend and precision returns exactly the float64 brute-force top k; low precision
changes only speed (and, on adversarial data, how often step 2 rescans).
"""

from __future__ import annotations

import functools
import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

import numpy as np

from subspace.engine._select import TopCandidates
from subspace.errors import FieldError
from subspace.layout import SubspaceLayout
from subspace.scoring import subspace_scores

PRECISIONS: dict[str, float] = {
    # storage precision -> unit roundoff of one stored value (0 = the master itself)
    "float32": 0.0,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
_U32 = 2.0**-24
_RERANK_BLOCK = 1 << 21  # float64 elements gathered at once by the re-rank (16 MiB)


class SearchResult(NamedTuple):
    scores: np.ndarray  # (nq, k') float32, descending; k' = min(k, N)
    rows: np.ndarray  # (nq, k') int64 row indices into the corpus; ties -> lower row first
    subspace_scores: np.ndarray  # (nq, k', K) float32 per-block cosines of those hits (unweighted)


class BackendUnavailable(RuntimeError):  # noqa: N818 - the name is the interface
    """A backend cannot start here (missing library, no device, unsupported precision)."""


class EngineInputError(FieldError):
    """Bad search input; ``field`` names it (``queries``, ``block_weights``, ``k``, ...)."""


def default_threads() -> int:
    """All cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Backend(ABC):
    """Load a corpus once; answer batches of weighted queries exactly.

    ``corpus``: ``(N, D)`` float32 or float16, block-normalised; kept as given (no copy), so a
    read-only ``np.memmap`` from the bundle stays on disk. ``precision`` is the storage the scan
    reads: ``float32`` scans the master itself, ``float16``/``bfloat16`` scan a low-precision
    copy in RAM and re-rank against the master. ``threads`` defaults to all cores;
    ``chunk_rows`` (rows scanned per step) defaults to a size that keeps the working set small.
    """

    name: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]] = ("float32",)

    def __init__(
        self,
        corpus: np.ndarray,
        layout: SubspaceLayout,
        *,
        precision: str = "float32",
        threads: int | None = None,
        chunk_rows: int | None = None,
    ) -> None:
        self._require()
        check_precision(precision)
        if precision not in self.precisions:
            raise BackendUnavailable(
                f"{self.name}: precision {precision!r} is not supported here; "
                f"supported: {list(self.precisions)}"
            )
        if not isinstance(corpus, np.ndarray) or corpus.ndim != 2:
            raise EngineInputError("corpus must be a 2-D numpy array (N, D)", "corpus")
        if corpus.dtype not in (np.float32, np.float16):
            raise EngineInputError(f"corpus dtype must be float32 or float16, got {corpus.dtype}", "corpus")
        if corpus.shape[1] != layout.dim:
            raise EngineInputError(
                f"corpus has {corpus.shape[1]} columns, the layout has {layout.dim}", "corpus"
            )
        if corpus.shape[0] == 0:
            raise EngineInputError("corpus is empty: at least one row is required", "corpus")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise EngineInputError(f"threads must be an integer >= 1 or None, got {threads!r}", "threads")
        if chunk_rows is not None and (
            isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
        ):
            raise EngineInputError(
                f"chunk_rows must be an integer >= 1 or None, got {chunk_rows!r}", "chunk_rows"
            )
        self.master = corpus
        self.layout = layout
        self._precision = precision
        self.threads = threads or default_threads()
        self.chunk_rows = chunk_rows
        self._indicator = layout.indicator(np.float64)
        self._max_block_norm = max_block_norms(corpus, layout)
        self.rescans = 0  # queries that needed a wider candidate set (step 2), since start
        self._load(corpus)

    # --- what a backend provides ----------------------------------------------------------
    def _require(self) -> None:  # noqa: B027 - optional hook: most backends need nothing
        """Raise :class:`BackendUnavailable` (with the reason) when this backend cannot run here.

        Runs before anything else, so the fallback chain can log why and move on.
        """

    def _load(self, corpus: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Build the scan structures from the validated corpus; the master stays as given."""

    # --- properties ---------------------------------------------------------------------
    @property
    def num_docs(self) -> int:
        return int(self.master.shape[0])

    @property
    def dim(self) -> int:
        return int(self.master.shape[1])

    @property
    def precision(self) -> str:
        return self._precision

    def set_threads(self, threads: int) -> None:
        """Change the thread count for later searches."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise EngineInputError(f"threads must be an integer >= 1, got {threads!r}", "threads")
        self.threads = threads

    # --- what a backend implements ----------------------------------------------------------
    @abstractmethod
    def _scan(self, scaled: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``c`` rows per query by scan score: ``(rows int64, scores float32)``, ``(nq, m)``.

        ``scaled``: ``(nq, D)`` float32 block-scaled queries. Sorted by score desc; entries tied
        with the ``c``-th may be included (``m > c``); padding is row ``-1``, score ``-inf``.
        """

    def _scan_rel_error(self, nq: int) -> float:
        """Bound on ``|s' - s|`` per unit of ``sum_k w_k |q_k| |d_k|`` for a scan of ``nq`` queries.

        Storage rounding of the corpus (unit roundoff ``u``) plus float32 rounding of the scaled
        query and of the sums (``~D u32``, Higham's dot-product bound, doubled for safety).
        Backends that also round the query and the product to low precision add ``2u``.
        """
        u = PRECISIONS[self._precision]
        # float16 subnormals (|x| < 2**-14) carry an absolute error up to 2**-25 instead of u|x|
        subnormal = 2.0**-25 * self.dim**0.5 if self._precision == "float16" else 0.0
        return (1.0 + 2.0 * self._lowp_products(nq)) * u + subnormal + 2.0 * (self.dim + 4) * _U32

    def _lowp_products(self, nq: int) -> bool:
        """Does a scan of ``nq`` queries round queries and products to the storage precision?"""
        return False

    def candidates(self, k: int) -> int:
        """Candidate-set size for a top ``k``: a margin for fp32 roundoff, more for low precision."""
        if self._precision == "float32":
            return k + max(8, k // 8)
        return k + max(64, k)

    # --- the search -----------------------------------------------------------------------
    def search(
        self, queries: np.ndarray, block_weights: np.ndarray, k: int, allowed: Any = None
    ) -> SearchResult:
        """Exact weighted top ``k`` of a batch.

        ``queries``: ``(nq, D)`` block-normalised, unscaled; ``block_weights``: ``(K,)`` or
        ``(nq, K)``, finite and ``>= 0``. Returns ``min(k, N)`` hits per query.
        ``allowed``: ``None`` (every row) or an ``(N,)`` boolean mask of the rows that may be
        returned (a metadata filter, :mod:`subspace.filters`): then the exact top ``k`` among
        those rows, ``min(k, allowed.sum())`` hits per query (:meth:`_search_allowed`).
        """
        q, w, k = self._validate(queries, block_weights, k)
        if allowed is not None:
            return self._search_allowed(q, w, k, self._check_allowed(allowed))
        n = self.num_docs
        kk = min(k, n)
        scaled64, scaled32, scale = self._scaled(q, w)

        def step(pending: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
            if c >= n:
                every = np.broadcast_to(np.arange(n, dtype=np.int64), (pending.size, n))
                return every, np.ones(pending.size, bool)
            rows, scan = self._scan(scaled32[pending], c)
            eps = self._scan_rel_error(pending.size) * scale[pending]
            done = self._complete(rows, scan, kk, c, eps)
            return self._prune(rows, scan, kk, eps), done

        return self._refine(q, scaled64, kk, self.candidates(kk), step)

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to release
        """Release what the backend holds beyond memory (threads, device buffers, indexes).

        The service calls it once no request uses the engine any more (a hot reload retired
        it); a backend must not be searched after. Idempotent.
        """

    # --- filtered search (an allowed-rows mask) ---------------------------------------------
    def _check_allowed(self, allowed: Any) -> np.ndarray:
        mask = np.asarray(allowed)
        if mask.dtype != np.bool_ or mask.shape != (self.num_docs,):
            raise EngineInputError(
                f"allowed must be a boolean mask of shape ({self.num_docs},), got {mask.dtype} {mask.shape}",
                "allowed",
            )
        return mask

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass whose own ``search`` predates ``allowed`` still answers filtered searches:
        exactly, through :meth:`_search_allowed` over the allowed rows only (never its scan)."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("search")
        if own is None or "allowed" in inspect.signature(own).parameters:
            return

        @functools.wraps(own)
        def search(
            self: Backend, queries: np.ndarray, block_weights: np.ndarray, k: int, allowed: Any = None
        ) -> SearchResult:
            if allowed is None:
                result: SearchResult = own(self, queries, block_weights, k)
                return result
            q, w, kk = self._validate(queries, block_weights, k)
            return self._search_allowed(q, w, kk, self._check_allowed(allowed), own_scan=False)

        cls.search = search  # type: ignore[method-assign]

    def _search_allowed(
        self, q: np.ndarray, w: np.ndarray, k: int, mask: np.ndarray, *, own_scan: bool = True
    ) -> SearchResult:
        """The exact top ``k`` among the rows of ``mask``, by the same three steps.

        A selective mask (at most a quarter of the rows) scans only its rows (gathered, float32
        products, :class:`~subspace.engine._select.TopCandidates`); a broad one asks the
        backend's own scan for ``c * N / n_allowed`` candidates and keeps the allowed ones. The
        completeness check holds the same way: a row outside the candidates scores at most the
        scan's ``c``-th score ``b``, so the allowed top ``k`` is complete once ``b`` is below its
        ``k``-th by ``2 eps``; otherwise the query is rescanned with ``4c``. ``own_scan=False``
        always takes the first way (exact whatever the backend's scan is).
        """
        nq, n, K = q.shape[0], self.num_docs, len(self.layout)
        idx = np.flatnonzero(mask)
        na = int(idx.size)
        kk = min(k, na)
        if kk == 0:
            empty = np.empty((nq, 0))
            return SearchResult(
                empty.astype(np.float32), empty.astype(np.int64), np.empty((nq, 0, K), np.float32)
            )
        scaled64, scaled32, scale = self._scaled(q, w)
        subset = 4 * na <= n or not own_scan
        total = na if subset else n
        c = self.candidates(kk)
        if not subset:
            c = -(-c * n // na)

        def step(pending: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
            if c >= total:
                return np.broadcast_to(idx, (pending.size, na)), np.ones(pending.size, bool)
            if subset:
                full, scan = self._scan_rows(scaled32[pending], idx, c)
            else:
                full, scan = self._scan(scaled32[pending], c)
            eps = self._scan_rel_error(pending.size) * scale[pending]
            bound = scan[:, c - 1] if scan.shape[1] >= c else np.full(len(scan), -np.inf, np.float32)
            rows, scan = _keep_allowed(full, scan, mask, kk)
            kth = scan[:, kk - 1].astype(np.float64)
            done = ((rows >= 0).sum(axis=1) >= kk) & (bound.astype(np.float64) < kth - 2.0 * eps)
            done |= (full >= 0).sum(axis=1) >= total
            return self._prune(rows, scan, kk, eps), done

        return self._refine(q, scaled64, kk, c, step)

    def _scaled(self, q: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The block-scaled queries in float64 and float32, and per query the bound
        ``sum_k w_k |q_k| max|d_k|`` on any score (the scan's error scales with it)."""
        scaled64 = q.astype(np.float64) * self.layout.expand(w)  # (nq, D)
        qnorm = np.sqrt((q.astype(np.float64) ** 2) @ self._indicator)  # (nq, K)
        return scaled64, scaled64.astype(np.float32), (w * qnorm) @ self._max_block_norm

    def _refine(
        self,
        q: np.ndarray,
        scaled64: np.ndarray,
        kk: int,
        c: int,
        step: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
    ) -> SearchResult:
        """The loop both searches share: ``step(pending, c)`` scans the pending queries for ``c``
        candidates and returns their pruned candidate rows and which are complete; those are
        re-ranked exactly, the others rescanned with ``4c``. Then the per-subspace scores."""
        nq = q.shape[0]
        out_rows = np.empty((nq, kk), np.int64)
        out_scores = np.empty((nq, kk), np.float32)
        pending = np.arange(nq)
        while pending.size:
            rows, done = step(pending, c)
            if done.any():
                sel = pending[done]
                out_rows[sel], out_scores[sel] = self._rerank(scaled64[sel], rows[done], kk)
            if not done.all():
                self.rescans += int((~done).sum())
            pending = pending[~done]
            c *= 4
        sub = subspace_scores(q, self.master, out_rows, self.layout).astype(np.float32)
        return SearchResult(out_scores, out_rows, sub)

    def _scan_rows(self, scaled: np.ndarray, idx: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_scan` restricted to rows ``idx`` (ascending), read from the master in float32."""
        sel = TopCandidates(scaled.shape[0], c)
        step = max(256, _RERANK_BLOCK // max(1, self.dim))
        for s in range(0, idx.size, step):
            block = np.asarray(self.master[idx[s : s + step]], dtype=np.float32)
            sel.add(np.ascontiguousarray(scaled @ block.T), s)
        pos, scores = sel.result()
        return np.where(pos >= 0, idx[np.maximum(pos, 0)], -1), scores

    def warmup(self) -> None:
        """One tiny search, so first-request costs (thread pools, page-ins) are paid up front."""
        q = np.asarray(self.master[:1], dtype=np.float32)
        self.search(q, self.layout.default_weights(), 1)

    # --- steps 2 and 3 ----------------------------------------------------------------------
    def _complete(self, rows: np.ndarray, scan: np.ndarray, k: int, c: int, eps: np.ndarray) -> np.ndarray:
        """Per query: can no row outside the candidates reach the exact top ``k``?"""
        count = (rows >= 0).sum(axis=1)
        if rows.shape[1] < c:
            return count >= self.num_docs
        gap_ok = scan[:, c - 1].astype(np.float64) < scan[:, k - 1].astype(np.float64) - 2.0 * eps
        return (count >= self.num_docs) | gap_ok

    @staticmethod
    def _prune(rows: np.ndarray, scan: np.ndarray, k: int, eps: np.ndarray) -> np.ndarray:
        """Drop candidates that cannot be in the top ``k``, before the (costly) exact re-rank.

        The ``k`` best candidates all score at least ``s'_(k) - eps``, so the exact ``k``-th
        score does too; a row with ``s' < s'_(k) - 2 eps`` scores below ``s'_(k) - eps``: out.
        ``scan`` is sorted descending, so the dropped rows are a tail, cut off where possible.
        """
        cut = scan[:, k - 1].astype(np.float64) - 2.0 * eps
        keep = scan.astype(np.float64) >= cut[:, None]
        keep[:, :k] = True
        width = max(k, int(keep.sum(axis=1).max()))
        return np.where(keep, rows, -1)[:, :width]

    def _rerank(self, scaled64: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Float64 scores of candidate ``rows`` ``(nq, m)`` (``-1`` = padding); exact top ``k``."""
        exact = exact_scores(
            np, lambda i: np.asarray(self.master[i], dtype=np.float64), scaled64, rows, _RERANK_BLOCK
        )
        key_rows = np.where(rows >= 0, rows, np.iinfo(np.int64).max)
        order = np.lexsort((key_rows, -exact), axis=-1)[:, :k]
        return np.take_along_axis(rows, order, 1), np.take_along_axis(exact, order, 1).astype(np.float32)

    # --- validation -------------------------------------------------------------------------
    def _validate(self, queries: Any, block_weights: Any, k: Any) -> tuple[np.ndarray, np.ndarray, int]:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise EngineInputError(f"k must be an integer >= 1, got {k!r}", "k")
        q = np.asarray(queries)
        if q.ndim != 2 or q.shape[1] != self.dim or q.shape[0] == 0:
            raise EngineInputError(f"queries must have shape (nq >= 1, {self.dim}), got {q.shape}", "queries")
        if not np.issubdtype(q.dtype, np.floating):
            raise EngineInputError(f"queries must be floating point, got {q.dtype}", "queries")
        q = np.ascontiguousarray(q, dtype=np.float32)
        if not np.isfinite(q).all():
            raise EngineInputError("queries contain NaN or infinite values", "queries")
        K = len(self.layout)
        w = np.asarray(block_weights, dtype=np.float64)
        if w.shape not in ((K,), (q.shape[0], K)):
            raise EngineInputError(
                f"block_weights must have shape ({K},) or ({q.shape[0]}, {K}) in layout order "
                f"{list(self.layout.names)}, got {w.shape}",
                "block_weights",
            )
        if not np.isfinite(w).all() or (w < 0).any():
            raise EngineInputError("block_weights must be finite and >= 0", "block_weights")
        return q, np.broadcast_to(w, (q.shape[0], K)), int(k)


def exact_scores(
    xp: ModuleType, gather: Callable[[Any], Any], scaled64: Any, rows: Any, elements: int
) -> Any:
    """Float64 scores ``<scaled64[i], master[rows[i, j]]>`` of candidate ``rows`` ``(nq, m)``
    (``-1`` = none: ``-inf``), on the arrays of module ``xp`` (numpy, cupy). ``gather(idx)``
    returns the master's rows ``idx`` in float64; it is asked for about ``elements`` values at
    a time (tiles of queries x candidates), so the gathered block stays bounded."""
    nq, m = rows.shape
    dim = scaled64.shape[1]
    exact = xp.full((nq, m), -xp.inf, dtype=xp.float64)
    cols = max(1, min(m, elements // dim))
    step = max(1, elements // (dim * cols))
    for q0 in range(0, nq, step):
        q1 = min(nq, q0 + step)
        for c0 in range(0, m, cols):
            c1 = min(m, c0 + cols)
            r = rows[q0:q1, c0:c1]
            valid = r >= 0
            hits = gather(xp.where(valid, r, 0).reshape(-1)).reshape(q1 - q0, c1 - c0, dim)
            s = xp.matmul(hits, scaled64[q0:q1, :, None])[..., 0]
            exact[q0:q1, c0:c1] = xp.where(valid, s, -xp.inf)
    return exact


def _keep_allowed(
    rows: np.ndarray, scores: np.ndarray, mask: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates ``(nq, m)`` (sorted, ``-1`` padding) -> the allowed ones, still sorted, left
    aligned, padded to at least ``k`` columns."""
    keep = (rows >= 0) & mask[np.maximum(rows, 0)]
    width = max(k, int(keep.sum(axis=1).max()) if keep.size else 0)
    order = np.argsort(~keep, axis=1, kind="stable")[:, :width]
    out_rows = np.take_along_axis(np.where(keep, rows, -1), order, 1)
    out_scores = np.take_along_axis(np.where(keep, scores, -np.inf), order, 1)
    if out_rows.shape[1] < width:
        pad = width - out_rows.shape[1]
        out_rows = np.pad(out_rows, ((0, 0), (0, pad)), constant_values=-1)
        out_scores = np.pad(out_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    return out_rows, out_scores.astype(np.float32)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise EngineInputError(
            f"precision {precision!r} is unknown; allowed: {list(PRECISIONS)}", "precision"
        )


def max_block_norms(corpus: np.ndarray, layout: SubspaceLayout, chunk: int = 16384) -> np.ndarray:
    """``(K,)`` float64: the largest L2 norm of each block over the corpus (one chunked pass).

    Normally ~1 (block-normalised rows); measured rather than assumed so that the completeness
    bound stays a bound on any corpus. Rejects NaN or infinite values.
    """
    m = layout.indicator(np.float32)
    out = np.zeros(len(layout), np.float32)
    for s in range(0, corpus.shape[0], chunk):
        block = np.asarray(corpus[s : s + chunk], dtype=np.float32)
        sq = (block * block) @ m
        if not np.isfinite(sq).all():
            raise EngineInputError(f"corpus rows {s}..{s + len(block) - 1} contain NaN or inf", "corpus")
        np.maximum(out, sq.max(axis=0), out=out)
    return np.sqrt(out.astype(np.float64)) * (1.0 + 1e-5)
