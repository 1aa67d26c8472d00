"""The engine contract: exact weighted top-k over one concatenated, block-normalised corpus.

docs/architecture.md section 1: with block-normalised rows and weights ``w_k >= 0``,
``score(q, d) = sum_k w_k <q_k, d_k> = <concat_k(w_k q_k), d>``, so a backend only ever scans
block-*scaled* queries against the unchanged corpus. :meth:`Backend.search` is the one refine
loop every backend runs (its steps in :mod:`esp_retrieval.subspace.engine.refine`):

1. **scan** (the backend's part, :meth:`Backend._scan`: chunked, float32 or low precision, on
   the host or a device): the top ``c >= k`` candidates per query by the scan score ``s'``,
   sorted, ties at the cut kept;
2. **completeness check**: ``|s' - s| <= eps`` is bounded from the scan's roundoff
   (``eps = rel_error * sum_k w_k |q_k| max|d_k|``). If ``s'_(c) < s'_(k) - 2 eps`` no row outside
   the candidates can reach the top k; otherwise that query is rescanned with ``4c``;
3. **exact re-rank**: candidates re-scored in float64 from the master corpus (the float32 or
   float16 matrix as given, e.g. memory-mapped from the bundle), ordered by (score desc, row asc).

Sparse blocks (``sparse_blocks``, a BM25 :class:`~esp_retrieval.subspace.sparse.SparseLexical`) are one more
exact term of the score in every step (:mod:`esp_retrieval.subspace.engine.sparse_terms`), for a backend
whose :class:`Capabilities` declare ``sparse``.

So every backend and precision returns exactly the float64 brute-force top k; low precision
changes only speed (and, on adversarial data, how often step 2 rescans). An approximate backend
supplies its own candidates instead (:meth:`Backend._candidates`) and declares so in its
:class:`Capabilities`; its candidates are still re-ranked exactly.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.engine import refine
from esp_retrieval.subspace.engine._select import TopCandidates
from esp_retrieval.subspace.engine.refine import Array, Batch, Candidates, Filter
from esp_retrieval.subspace.engine.sparse_terms import SparseBatch, SparseBlocks, SparseQuery, SparseScan
from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.filters import MetadataSchema
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import subspace_scores
from esp_retrieval.subspace.sparse import SparseLexical

PRECISIONS: dict[str, float] = {
    # storage precision -> unit roundoff of one stored value (0 = the master itself)
    "float32": 0.0,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
_U32 = 2.0**-24
_F16_SUB = 2.0**-25  # absolute rounding error of a float16 subnormal (|x| < 2**-14)


class SearchResult(NamedTuple):
    scores: np.ndarray  # (nq, k') float32, descending; k' = min(k, N)
    rows: np.ndarray  # (nq, k') int64 row indices into the corpus; ties -> lower row first
    #: (nq, k', K + S) float32 per-block scores of those hits (unweighted): the K cosines in
    #: layout order, then the S sparse blocks of the search's ``sparse`` argument in its order
    subspace_scores: np.ndarray


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond the exact search of :class:`Backend`; the service asks these,
    never the backend's attributes."""

    #: ``allowed`` may be a :class:`~esp_retrieval.subspace.filters.CompiledFilter`: the backend evaluates it
    native_filters: bool = False
    #: the backend holds its documents: :attr:`Backend.metadata_schema` and
    #: :meth:`Backend.documents` (ids and display fields of hits) instead of the bundle's
    metadata: bool = False
    #: :meth:`Backend.upsert` and :meth:`Backend.delete` (``POST``/``DELETE /v1/documents``)
    writes: bool = False
    #: results may be approximate (by the backend's settings); they are still re-ranked exactly
    approximate: bool = False
    #: sparse blocks (``sparse_blocks`` at construction, ``sparse`` in :meth:`Backend.search`)
    #: are scored exactly beside the dense ones; without it a backend refuses both
    sparse: bool = False


@dataclass(frozen=True)
class LiveDocument:
    """A document to write: id, ``(D,)`` block-normalised vector, metadata values by field."""

    id: str
    vector: np.ndarray
    fields: Mapping[str, Any]


class BackendUnavailable(RuntimeError):  # noqa: N818 - the name is the interface
    """A backend cannot start here (missing library, no device, unsupported precision)."""


class EngineInputError(FieldError):
    """Bad search input; ``field`` names it (``queries``, ``block_weights``, ``k``, ...)."""


class SparseUnsupportedError(EngineInputError):
    """A sparse search on a backend without ``capabilities.sparse``; ``field`` is ``sparse``."""


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
    copy and re-rank against the master. ``threads`` defaults to all cores; ``chunk_rows``
    (rows scanned per step) defaults to a size that keeps the working set small.

    A backend supplies its scan (:meth:`_scan`) and, optionally, where it runs
    (:meth:`_array_module`, :meth:`_to_device`, :meth:`_to_host`) and its own candidates
    (:meth:`_candidates`, an approximate index or a store); the rest is this class.
    """

    name: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]] = ("float32",)
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: the scan applies a row mask itself (:meth:`_scan_masked`)
    scan_masks: ClassVar[bool] = False
    #: float64 elements gathered at once by the re-rank and the per-subspace scores
    rerank_elements: ClassVar[int] = 1 << 21
    #: the schema of the documents a backend with ``capabilities.metadata`` holds
    metadata_schema: MetadataSchema | None = None

    def __init__(
        self,
        corpus: np.ndarray,
        layout: SubspaceLayout,
        *,
        precision: str = "float32",
        threads: int | None = None,
        chunk_rows: int | None = None,
        sparse_blocks: Mapping[str, SparseLexical] | None = None,
    ) -> None:
        self._require()
        if sparse_blocks and not self.capabilities.sparse:
            raise BackendUnavailable(
                f"{self.name}: cannot score sparse blocks ({list(sparse_blocks)}); "
                "backends that can: those whose capabilities declare sparse"
            )
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
        #: the sparse blocks held (name -> block in ``.blocks``) and their posting lists; ``None``: none
        self.sparse_blocks = self._check_sparse_blocks(sparse_blocks or {}, corpus.shape[0])
        self._precision = precision
        self.threads = threads or default_threads()
        self.chunk_rows = chunk_rows
        self._indicator = layout.indicator(np.float64)
        self._max_block_norm = max_block_norms(corpus, layout)
        self.rescans = 0  # queries that needed a wider candidate set (step 2), since start
        self.xp: ModuleType = self._array_module()
        self._master_dev: Any = corpus  # what the re-rank gathers from (a device backend: its copy)
        self._load(corpus)
        xp = self.xp  # the layout's constants, where the loop runs
        self._block_of = xp.asarray(layout.block_ids())
        self._ind64 = xp.asarray(self._indicator)
        self._maxnorm = xp.asarray(self._max_block_norm)
        # float16 queries and scores: a subnormal is off by up to 2**-25 absolute, not relative
        dims = np.asarray(layout.dims, np.float64)
        self._lowp_abs = _F16_SUB * (float(np.sqrt(dims) @ self._max_block_norm) + 1.0)

    # --- what a backend provides ----------------------------------------------------------
    def _require(self) -> None:  # noqa: B027 - optional hook: most backends need nothing
        """Raise :class:`BackendUnavailable` (with the reason) when this backend cannot run here.

        Runs before anything else, so the fallback chain can log why and move on.
        """

    def _load(self, corpus: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Build the scan structures from the validated corpus; the master stays as given."""

    @abstractmethod
    def _scan(self, scaled: Array, c: int, sparse: SparseScan | None = None) -> tuple[Array, Array]:
        """Top ``c`` rows per query by scan score: ``(rows int64, scores float32)``, ``(nq, m)``.

        ``scaled``: ``(nq, D)`` float32 block-scaled queries (arrays of :attr:`xp`). Sorted by
        score desc; entries tied with the ``c``-th may be included (``m > c``); padding is row
        ``-1``, score ``-inf``, and fewer than ``c`` rows come back only when fewer are there.
        ``sparse``: the sparse blocks' scan scores, added to the dense ones before selecting
        (given only to a backend with ``capabilities.sparse``).
        """

    def _scan_masked(
        self, scaled: Array, c: int, allowed: Array, sparse: SparseScan | None = None
    ) -> tuple[Array, Array]:
        """:meth:`_scan` among the rows of ``allowed`` (a mask on :attr:`xp`; other rows are not
        returned), for a backend whose scan masks (:attr:`scan_masks`)."""
        raise NotImplementedError(f"{self.name}: the scan takes no mask")

    def _array_module(self) -> ModuleType:
        """The module of the arrays the search runs on (numpy; a device backend: cupy)."""
        return np

    def _to_device(self, x: np.ndarray) -> Array:
        return self.xp.asarray(x)

    def _to_host(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def _stable_argsort(self, x: Array) -> Array:
        """Per-row ascending order of ``x`` ``(m, M)``, equal entries kept in column order."""
        return self.xp.argsort(x, axis=1, kind="stable")

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

    # --- the search: one refine loop ------------------------------------------------------
    def search(
        self,
        queries: np.ndarray,
        block_weights: np.ndarray,
        k: int,
        allowed: Any = None,
        sparse: Mapping[str, SparseQuery] | None = None,
    ) -> SearchResult:
        """Exact weighted top ``k`` of a batch.

        ``queries``: ``(nq, D)`` block-normalised, unscaled; ``block_weights``: ``(K,)`` or
        ``(nq, K)``, finite and ``>= 0``. Returns ``min(k, N)`` hits per query.
        ``allowed``: ``None`` (every row) or an ``(N,)`` boolean mask of the rows that may be
        returned (a metadata filter, :mod:`esp_retrieval.subspace.filters`; a backend with
        ``capabilities.native_filters`` also takes the compiled filter itself): then the exact
        top ``k`` among those rows, ``min(k, allowed.sum())`` hits per query. Where the number
        of allowed rows is not known here (a store), shorter lists are padded with row ``-1``.
        ``sparse``: name -> :class:`SparseQuery` ``(vectors (nq, V), weight () or (nq,))`` of
        sparse blocks the backend holds (``sparse_blocks``): the score is then
        ``sum_k w_k cos_k + sum_s w_s <q_s, d_s>``, still exact, and ``subspace_scores`` has a
        column per named block after the dense ones. A backend without ``capabilities.sparse``
        raises :class:`SparseUnsupportedError`.

        On the array module: the host sends the queries and weights once and receives the
        results once per round (with a ``(nq,)`` flag saying which queries the bound accepts;
        the others are rescanned with ``4c``, rarely).
        """
        q, w, k = self._validate(queries, block_weights, k)
        terms = self._validate_sparse(sparse, q.shape[0])
        flt = self._filter(allowed)
        nq = q.shape[0]
        nk = len(self.layout) + (0 if terms is None else len(terms.names))
        kk = k if flt.n_allowed is None else min(k, flt.n_allowed)
        if kk == 0:
            none = np.empty((nq, 0))
            sub0 = np.empty((nq, 0, nk), np.float32)
            return SearchResult(none.astype(np.float32), none.astype(np.int64), sub0)
        batch = self._batch(q, w, kk, terms)
        out_rows = np.full((nq, kk), -1, np.int64)
        out_scores = np.full((nq, kk), -np.inf, np.float32)
        out_sub = np.zeros((nq, kk, nk), np.float32)
        pending = np.arange(nq)
        c = self.candidates(kk)
        while True:
            part = batch if len(pending) == nq else batch.take(self._to_device(pending))
            if flt.n_allowed is not None and c >= flt.n_allowed:  # every (allowed) row is a candidate
                cand = self._every(flt, len(pending))
            else:
                cand = self._candidates(part, c, flt)
            rows, done = self._complete(part, cand)
            r, s = self._rerank(part, rows, cand.source)
            sub = self._subspace(part, r, cand.source)
            # the one transfer back: results, and which queries the bound accepts
            done_h = np.ones(len(pending), bool) if done is None else self._to_host(done)
            rh, sh, subh = self._to_host(r), self._to_host(s), self._to_host(sub)
            idx = pending[done_h]
            out_rows[idx], out_scores[idx], out_sub[idx] = rh[done_h], sh[done_h], subh[done_h]
            if done_h.all():
                break
            self.rescans += int((~done_h).sum())
            pending = pending[~done_h]
            c *= 4
        if flt.n_allowed is None:  # as wide as the longest list found
            width = int((out_rows >= 0).sum(axis=1).max())
            out_rows, out_scores, out_sub = out_rows[:, :width], out_scores[:, :width], out_sub[:, :width]
        return SearchResult(out_scores, out_rows, out_sub)

    def _batch(self, q: np.ndarray, w: np.ndarray, k: int, sparse: SparseBatch | None = None) -> Batch:
        """The block-scaled queries where the loop runs (the one upload of queries and weights)."""
        qd = self._to_device(q)
        wd = self._to_device(np.ascontiguousarray(w, dtype=np.float64))
        return refine.scale(
            self.xp,
            qd,
            wd,
            block_of=self._block_of,
            indicator=self._ind64,
            max_norm=self._maxnorm,
            k=k,
            sparse=sparse,
        )

    def _eps(self, batch: Batch) -> Array:
        """Bound on ``|s' - s|`` per query, in the units of the scan (``Batch.factor``); the
        sparse term's rounding depends on the query's terms, so it is added per query."""
        m = batch.scan.shape[0]
        eps = self._scan_rel_error(m) * batch.bound * batch.factor
        if batch.sparse is not None:
            eps = eps + self.xp.asarray(batch.sparse.scan_error(self._to_host(batch.bound))) * batch.factor
        return eps + self._lowp_abs if self._lowp_products(m) else eps

    def _sparse_scan(self, batch: Batch) -> SparseScan | None:
        """The float32 scan scores of the batch's sparse terms (``None``: it has none)."""
        if batch.sparse is None:
            return None
        assert self.sparse_blocks is not None
        return self.sparse_blocks.scan(batch.sparse, self._to_host(batch.factor))

    def _complete(self, batch: Batch, cand: Candidates) -> tuple[Array, Array]:
        """Steps 2 and 3's first half: the candidates worth re-ranking, and per query whether
        they are complete (``None``: all are, the generator vouched for them)."""
        if cand.scores is None:
            return cand.rows, None
        xp, eps = self.xp, self._eps(batch)
        done = None if cand.bound is None else refine.complete(xp, cand.scores, cand.bound, batch.k, eps)
        return refine.prune(xp, cand.rows, cand.scores, batch.k, eps, trim=xp is np), done

    def _every(self, flt: Filter, m: int) -> Candidates:
        every = np.arange(self.num_docs, dtype=np.int64) if flt.rows is None else flt.rows
        return Candidates(self.xp.broadcast_to(self._to_device(every), (m, every.size)))

    def _candidates(self, batch: Batch, c: int, flt: Filter) -> Candidates:
        """The scan's top ``c`` (among the allowed rows) and the bound on every other row.

        With a row mask: a scan that masks (:attr:`scan_masks`) takes it; otherwise a
        selective mask (at most a quarter of the rows) scans only its rows (:meth:`_scan_rows`)
        and a broad one asks the backend's scan for ``c * N / n_allowed`` candidates and keeps
        the allowed ones: a row outside those scores at most the wide scan's bound.
        """
        sparse = self._sparse_scan(batch)
        if flt.mask is None or self.scan_masks:
            if flt.mask is None:
                rows, scores = self._scan(batch.scan, c, sparse)
            else:
                rows, scores = self._scan_masked(batch.scan, c, flt.arg, sparse)
            return Candidates(rows, scores, refine.scan_bound(self.xp, rows, scores, c))
        assert flt.rows is not None
        assert flt.n_allowed is not None
        n = self.num_docs
        if 4 * flt.n_allowed <= n:
            rows, scores = self._scan_rows(batch.scan, flt.rows, c, sparse)
            return Candidates(rows, scores, refine.scan_bound(np, rows, scores, c))
        wide = -(-c * n // flt.n_allowed)
        if wide >= n:
            return self._every(flt, batch.scan.shape[0])
        full, scan = self._scan(batch.scan, wide, sparse)
        rows, scores = refine.keep_allowed(full, scan, flt.mask, batch.k)
        return Candidates(rows, scores, refine.scan_bound(np, full, scan, wide))

    def _scan_rows(
        self, scaled: np.ndarray, idx: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_scan` restricted to rows ``idx`` (ascending), read from the master in float32."""
        sel = TopCandidates(scaled.shape[0], c)
        step = max(256, self.rerank_elements // max(1, self.dim))
        for s in range(0, idx.size, step):
            block = np.asarray(self.master[idx[s : s + step]], dtype=np.float32)
            scores = np.ascontiguousarray(scaled @ block.T)
            sel.add(scores if sparse is None else sparse.add_rows(scores, idx[s : s + step]), s)
        pos, scores = sel.result()
        return np.where(pos >= 0, idx[np.maximum(pos, 0)], -1), scores

    def _exact_scores(self, batch: Batch, rows: Array, source: Any) -> Array:
        """Float64 scores of candidate ``rows`` ``(m, M)`` (``-1``: ``-inf``), vectors read from
        ``source`` (the master). The dense block-scaled product plus the sparse blocks' float64
        weighted dots (:mod:`esp_retrieval.subspace.engine.sparse_terms`)."""
        xp = self.xp
        dense = refine.exact_scores(
            xp, lambda i: source[i].astype(xp.float64), batch.scaled64, rows, self.rerank_elements
        )
        if batch.sparse is None:
            return dense
        assert self.sparse_blocks is not None
        return dense + self.xp.asarray(self.sparse_blocks.exact(batch.sparse, self._to_host(rows)))

    def _rerank(self, batch: Batch, rows: Array, source: Any = None) -> tuple[Array, Array]:
        """Exact top ``k`` of candidate ``rows``: ``(rows, scores float32)`` ``(m, k)``."""
        src = self._master_dev if source is None else source
        return refine.rank(self.xp, self._exact_scores(batch, rows, src), rows, batch.k, self._stable_argsort)

    def _subspace(self, batch: Batch, rows: Array, source: Any = None) -> Array:
        """Per-block scores ``(m, k, K + S)`` float32 of the hits (``0`` for padding): the dense
        cosines, then the sparse blocks' dots."""
        xp, queries = self.xp, batch.queries
        src = self._master_dev if source is None else source
        m, k = rows.shape
        step = max(1, self.rerank_elements // (max(1, k) * self.dim))
        parts = [
            subspace_scores(queries[q0 : q0 + step], src, rows[q0 : q0 + step], self.layout)
            for q0 in range(0, m, step)
        ]
        out = parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=0)
        if batch.sparse is not None:
            assert self.sparse_blocks is not None
            raw = self.sparse_blocks.raw(batch.sparse, self._to_host(rows))
            out = xp.concatenate([out, xp.asarray(raw)], axis=2)
        return xp.where((rows >= 0)[..., None], out, 0.0).astype(xp.float32)

    # --- filtered search (an allowed-rows mask) ---------------------------------------------
    def _filter(self, allowed: Any) -> Filter:
        """``allowed`` as the loop uses it (a backend that filters itself returns its own form)."""
        if allowed is None:
            return Filter(self.num_docs)
        mask = self._check_allowed(allowed)
        idx = np.flatnonzero(mask)
        return Filter(int(idx.size), idx, mask, self._to_device(mask) if self.scan_masks else mask)

    def _check_allowed(self, allowed: Any) -> np.ndarray:
        mask = np.asarray(allowed)
        if mask.dtype != np.bool_ or mask.shape != (self.num_docs,):
            raise EngineInputError(
                f"allowed must be a boolean mask of shape ({self.num_docs},), got {mask.dtype} {mask.shape}",
                "allowed",
            )
        return mask

    # --- what capabilities promise (Capabilities) -----------------------------------------
    def documents(self, rows: Iterable[int]) -> list[tuple[str, dict[str, Any]]]:
        """``(id, display fields)`` of each row a search returned (``capabilities.metadata``)."""
        raise BackendUnavailable(f"{self.name}: the bundle names the hits, not the backend")

    def upsert(self, docs: Sequence[LiveDocument]) -> list[int]:
        """Insert or replace documents by id; returns their rows (``capabilities.writes``)."""
        raise BackendUnavailable(f"{self.name}: an immutable index takes no writes")

    def delete(self, doc_id: str) -> bool:
        """Delete a document by id; ``False`` when there is none (``capabilities.writes``)."""
        raise BackendUnavailable(f"{self.name}: an immutable index takes no writes")

    # --- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to release
        """Release what the backend holds beyond memory (threads, device buffers, indexes).

        The service calls it once no request uses the engine any more (a hot reload retired
        it); a backend must not be searched after. Idempotent.
        """

    def warmup(self) -> None:
        """One small search, so first-request costs (thread pools, page-ins) are paid up front."""
        q = np.asarray(self.master[:1], dtype=np.float32)
        self.search(q, self.layout.default_weights(), min(10, self.num_docs))

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

    def _check_sparse_blocks(self, blocks: Mapping[str, SparseLexical], n: int) -> SparseBlocks | None:
        """The ``sparse_blocks`` argument, checked (one row per corpus row, finite), as the loop holds it."""
        for name, block in blocks.items():
            where = f"sparse_blocks.{name}"
            if not isinstance(block, SparseLexical):
                raise EngineInputError(f"{where} must be a SparseLexical, got {type(block).__name__}", where)
            if block.n_docs != n:
                raise EngineInputError(f"{where} has {block.n_docs} documents, the corpus {n}", where)
            if not np.isfinite(block.docs.data).all():
                raise EngineInputError(f"{where} contains NaN or infinite values", where)
        return SparseBlocks(blocks) if blocks else None

    def _validate_sparse(self, sparse: Mapping[str, Any] | None, nq: int) -> SparseBatch | None:
        """A search's ``sparse`` argument, checked against the blocks held (``None``: none)."""
        if not sparse:
            return None
        if not self.capabilities.sparse:
            raise SparseUnsupportedError(
                f"{self.name}: this backend scores no sparse block (capabilities.sparse is false)", "sparse"
            )
        held = {} if self.sparse_blocks is None else self.sparse_blocks.blocks
        parts = {}
        for name, part in sparse.items():
            where = f"sparse.{name}"
            if name not in held:
                raise EngineInputError(f"unknown sparse block {name!r}; the engine holds {list(held)}", where)
            try:
                vectors, weight = part
            except (TypeError, ValueError):
                raise EngineInputError(f"{where} must be a (vectors, weight) pair", where) from None
            n_vocab = len(held[name].vocab)
            if not sp.issparse(vectors) or vectors.shape != (nq, n_vocab):
                raise EngineInputError(
                    f"{where}.vectors must be a scipy sparse matrix of shape ({nq}, {n_vocab}), "
                    f"got {type(vectors).__name__} {getattr(vectors, 'shape', None)}",
                    f"{where}.vectors",
                )
            q = sp.csr_matrix(vectors, dtype=np.float64)  # term order kept: sums as SparseLexical.scores
            if not np.isfinite(q.data).all():
                raise EngineInputError(f"{where}.vectors contain NaN or infinite values", f"{where}.vectors")
            w = np.asarray(weight, dtype=np.float64)
            if w.shape not in ((), (nq,)) or not np.isfinite(w).all() or (w < 0).any():
                raise EngineInputError(
                    f"{where}.weight must be a finite number >= 0, or ({nq},) of them", f"{where}.weight"
                )
            parts[name] = (q, np.array(np.broadcast_to(w, (nq,))))
        return self.sparse_blocks.batch(parts) if self.sparse_blocks is not None else None


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
