"""``pq``: approximate weighted top k from a product-quantised screen, exact re-rank on the master.

Product quantisation (Jégou, Douze and Schmid, TPAMI 2011) in faiss's 4-bit "fast scan" form
(André, Kermarrec and Le Scouarnec, VLDB 2015; ``faiss.IndexPQFastScan``): every row is
``D / dsub`` codes of 4 bits, one per ``dsub`` consecutive columns, and a query is scored
against all of them from in-register lookup tables. The score is linear in the block-scaled
query (docs/architecture.md section 1: ``score = <concat_k(w_k q_k), d>``) and the codes do not
depend on the weights: a request's weights scale the query, hence its lookup tables, so one
screen serves every weight vector. No sub-quantiser straddles two blocks (the screened blocks' columns
are concatenated and every width is a multiple of ``dsub``), so each table entry belongs to one
block's weight.

**Posted blocks.** A block whose rows are sparse (at most ``posting_density`` of their entries
nonzero on the training sample: the lexical entity block, ~5% at 47 of 1,024 columns) is not
quantised. Its columns are held as posting lists (the ``(D_p, N)`` CSR of the block), and a
query, which reaches few of them (the median TREC DL query: 5 entity columns), scores every row
of the block exactly by a scatter-add over those lists. The screen then covers the dense blocks
only (at 1M rows: 104 MB of codes for semantic + intent instead of 360 MB for every column), and
its lookup tables are no longer mostly zero.

Per query the search is

1. the screen's top ``screen`` rows by approximate score (widened by ``N / allowed`` under a
   broad row mask); with posted blocks, every row whose exact posted score could lift it into
   the top ``c`` (:func:`posted_extras`: a row outside the screen has a screen score of at most
   the lowest screened one); with sparse blocks, the top ``screen`` rows of their own scan (a
   row can be in the top k by its sparse score alone);
2. their float32 scan scores from the master (the same scan score, and so the same roundoff
   bound ``eps``, as the exact scan's), sparse terms added;
3. the refine loop of every backend: candidates below the k-th minus ``2 eps`` dropped, the
   rest re-ranked in float64 on the master.

So a hit's score is always exact; what is approximate is whether the true top k were among the
screened rows (recall, measured by ``bench/ann.py`` at every weight vector of the simplex grid).
A selective mask (at most a quarter of the rows) is answered by the exact scan of its rows, and
a corpus under ``exact_below`` rows by the numpy backend's exact scan: there the screen's fixed
cost does not pay (the same rule as ``ivf``, :data:`~esp_retrieval.subspace.engine.ivf.EXACT_BELOW`).
The screen is built at load (faiss k-means per sub-quantiser on a seeded sample, then encoding);
``build_seconds`` says how long it took.
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from esp_retrieval.subspace.engine._gemv import indexed_rows_dot
from esp_retrieval.subspace.engine.base import Capabilities, EngineInputError
from esp_retrieval.subspace.engine.exact_fallback import ExactFallback
from esp_retrieval.subspace.engine.ivf import EXACT_BELOW
from esp_retrieval.subspace.engine.refine import Batch, Candidates, Filter, stack_rows
from esp_retrieval.subspace.engine.sparse_terms import SparseScan
from esp_retrieval.subspace.layout import Objective, SubspaceLayout

log = logging.getLogger(__name__)
_CHUNK = 65536
#: a block with at most this share of nonzero entries (the lexical entity block: ~5%) is scored
#: exactly from posting lists, not screened: a query reaches few of its columns
POSTING_DENSITY = 0.25


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineInputError(f"{name} must be an integer >= 1, got {value!r}", name)
    return value


def _columns(blocks: list[Objective]) -> np.ndarray:
    """The corpus columns of ``blocks``, in layout order."""
    return np.concatenate([np.arange(b.offset, b.end) for b in blocks] or [np.zeros(0, np.int64)])


def _rows(corpus: np.ndarray, rows: Any, columns: np.ndarray | None) -> np.ndarray:
    """``corpus[rows]`` (a slice or row indices) restricted to ``columns`` (``None``: all), float32.
    The columns are read as slices of their consecutive runs (a block's columns are one run): a
    fancy index over a million rows' columns is about 25x slower."""
    part = corpus[rows]
    if columns is not None:
        cuts = np.flatnonzero(np.diff(columns) != 1) + 1
        runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(columns, cuts) if len(r)]
        part = np.hstack([part[:, a:b] for a, b in runs])
    return np.ascontiguousarray(part, dtype=np.float32)


def block_density(corpus: np.ndarray, layout: SubspaceLayout, sample: np.ndarray) -> dict[str, float]:
    """Per block, the share of nonzero entries in the ``sample`` rows of ``corpus``."""
    rows = np.asarray(corpus[sample])
    return {
        b.name: float(np.count_nonzero(rows[:, b.offset : b.end])) / max(1, rows[:, b.offset : b.end].size)
        for b in layout
    }


def build_screen(
    corpus: np.ndarray,
    layout: SubspaceLayout,
    *,
    dsub: int,
    train_rows: int,
    seed: int,
    shards: int = 1,
    blocks: list[Objective] | None = None,
) -> list[Any]:
    """``shards`` ``faiss.IndexPQFastScan`` (inner product, 4 bits per ``dsub`` columns) over
    consecutive row ranges of ``corpus`` ``(N, D)`` float32/float16, restricted to the columns of
    ``blocks`` (default: every block), one codebook trained on ``train_rows`` seeded rows. Shards
    let one query's screen run on several cores (faiss parallelises a search over its queries,
    not over the rows of one)."""
    import faiss

    blocks = list(layout) if blocks is None else blocks
    for block in blocks:
        if block.dim % dsub:
            raise EngineInputError(
                f"dsub {dsub} must divide every screened block's width; block {block.name!r} "
                f"spans columns {block.offset}..{block.end}",
                "dsub",
            )
    n = corpus.shape[0]
    columns = None if len(blocks) == len(layout) else _columns(blocks)
    d = corpus.shape[1] if columns is None else len(columns)
    trained = faiss.IndexPQFastScan(d, d // dsub, 4, faiss.METRIC_INNER_PRODUCT)
    trained.pq.cp.min_points_per_centroid = 1  # a small corpus trains on what it has, unwarned
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, size=min(n, train_rows), replace=False))
    trained.train(_rows(corpus, sample, columns))
    bounds = np.linspace(0, n, max(1, min(shards, n)) + 1).astype(np.int64)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        index = faiss.clone_index(trained)
        for s in range(int(lo), int(hi), _CHUNK):
            index.add(_rows(corpus, slice(s, min(s + _CHUNK, int(hi))), columns))
        out.append(index)
    return out


def build_postings(corpus: np.ndarray, columns: np.ndarray) -> sp.csr_matrix:
    """``(len(columns), N)`` float32 CSR: per column of ``corpus``, its nonzero rows in order (a
    posting list). Each chunk of rows is read once into a CSC matrix (its columns' rows in
    order), and the chunks' parts are then written where each list holds them, with no sort or
    stacking of the whole matrix."""
    n = len(corpus)
    parts = [
        (lo, sp.csr_matrix(_rows(corpus, slice(lo, min(lo + _CHUNK, n)), columns)).tocsc())
        for lo in range(0, n, _CHUNK)
    ]
    counts = np.stack([np.diff(part.indptr) for _, part in parts]) if parts else np.zeros((0, len(columns)))
    indptr = np.concatenate([[0], np.cumsum(counts.sum(axis=0))]).astype(np.int64)
    at = indptr[:-1] + np.cumsum(counts, axis=0) - counts  # where each chunk's part of a list starts
    indices = np.empty(int(indptr[-1]), np.int64 if n > np.iinfo(np.int32).max else np.int32)
    data = np.empty(int(indptr[-1]), np.float32)
    for j, (lo, part) in enumerate(parts):
        col = np.repeat(np.arange(len(columns)), counts[j])
        dest = at[j, col] + np.arange(len(col)) - part.indptr[col]
        indices[dest], data[dest] = part.indices + lo, part.data
    return sp.csr_matrix((data, indices, indptr), shape=(len(columns), n))


def _top_merged(
    parts: list[tuple[np.ndarray, np.ndarray]], offsets: np.ndarray, want: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(m, want)`` approximate scores (``-inf`` where no row) and global rows (``-1``): the best
    ``want`` of every shard's ``(scores, local rows)``."""
    scores = np.concatenate([np.where(i >= 0, d, -np.inf) for d, i in parts], axis=1)
    rows = np.concatenate(
        [np.where(i >= 0, i + off, -1) for (_, i), off in zip(parts, offsets, strict=True)], axis=1
    )
    if rows.shape[1] > want:
        top = np.argpartition(-scores, want - 1, axis=1)[:, :want]
        rows, scores = np.take_along_axis(rows, top, 1), np.take_along_axis(scores, top, 1)
    return scores, rows


def posted_extras(  # noqa: PLR0917
    rows: np.ndarray, approx: np.ndarray, scores: np.ndarray, posted: np.ndarray, c: int, cap: int
) -> np.ndarray:
    """The rows outside the screen whose exact posted score (``posted`` ``(N,)``) could lift them
    into the top ``c``, at most ``cap`` of them (the highest posted).

    ``rows`` are the screened rows, ``approx`` their screen scores and ``scores`` their scan
    scores from the master (posted part included). A row outside the screen has a screen score of
    at most the lowest screened one, and its true screened part exceeds its screen score by no
    more than the screen's error, taken as the largest excess seen on the screened rows; so it
    reaches the ``c``-th best screened total only with a posted score of at least that total
    minus both."""
    if len(rows) < c:  # fewer screened rows than wanted: every posted row may count
        threshold = -np.inf
    else:
        excess = float(np.max(scores - posted[rows] - approx))
        cth = np.partition(scores, len(scores) - c)[len(scores) - c]
        threshold = cth - approx.min() - max(excess, 0.0)
    extra = np.flatnonzero(posted >= max(threshold, np.finfo(np.float32).tiny))  # zero: no posting
    extra = np.setdiff1d(extra, rows, assume_unique=True)
    if len(extra) > cap:
        extra = np.sort(extra[np.argpartition(-posted[extra], cap - 1)[:cap]])
    return extra


class PqScreenBackend(ExactFallback):
    name: ClassVar[str] = "pq"
    precisions: ClassVar[tuple[str, ...]] = ("float32",)
    capabilities: ClassVar[Capabilities] = Capabilities(approximate=True, sparse=True)

    def __init__(
        self,
        corpus: np.ndarray,
        layout: SubspaceLayout,
        *,
        screen: int = 3000,
        dsub: int = 2,
        train_rows: int = 4096,
        seed: int = 0,
        exact_below: int = EXACT_BELOW,
        posting_density: float = POSTING_DENSITY,
        **settings: Any,
    ) -> None:
        """``screen``: rows re-scored per query (the recall knob); ``dsub``: columns per 4-bit
        code (smaller: finer codes, a slower screen); ``train_rows``: the seeded sample the codebooks
        learn from (faiss trains each 16-centroid sub-quantiser on at most 256 x 16 = 4,096 rows);
        ``exact_below``: below this many rows the
        exact scan answers (``0``: always screen); ``posting_density``: a block whose rows have at
        most this share of nonzero entries is scored exactly from posting lists instead of being
        screened (``0``: screen every block). ``settings``: the :class:`Backend` ones."""
        self.screen = _positive_int(screen, "screen")
        self.dsub = _positive_int(dsub, "dsub")
        self.train_rows = _positive_int(train_rows, "train_rows")
        self.seed = int(seed)
        self.exact_below = self._checked_exact_below(exact_below)
        if (
            isinstance(posting_density, bool)
            or not isinstance(posting_density, (int, float))
            or not (0.0 <= posting_density <= 1.0)
        ):
            raise EngineInputError(
                f"posting_density must be a number in [0, 1], got {posting_density!r}", "posting_density"
            )
        self.posting_density = float(posting_density)
        self.posted: tuple[str, ...] = ()  # the blocks scored from posting lists
        self._columns: np.ndarray | None = None  # the screened columns (None: all)
        self._posted_columns = np.zeros(0, np.int64)
        self._postings: sp.csr_matrix | None = None  # (posted columns, N)
        self.shards: list[Any] = []
        self._offsets = np.zeros(1, np.int64)
        self._pool: ThreadPoolExecutor | None = None
        self.build_seconds = 0.0
        super().__init__(corpus, layout, **settings)

    def _load(self, corpus: np.ndarray) -> None:
        n = corpus.shape[0]
        if n < self.exact_below:
            self._start_exact(corpus, f"{n} rows < exact_below {self.exact_below}")
            return
        t0 = time.perf_counter()
        sample = np.sort(
            np.random.default_rng(self.seed).choice(n, size=min(n, self.train_rows), replace=False)
        )
        density = block_density(corpus, self.layout, sample)
        posted = [b for b in self.layout if self.posting_density and density[b.name] <= self.posting_density]
        screened = [b for b in self.layout if b not in posted]
        if not screened:  # nothing left to screen: the screen takes every block, as without postings
            posted, screened = [], list(self.layout)
        self.shards = build_screen(
            corpus,
            self.layout,
            dsub=self.dsub,
            train_rows=self.train_rows,
            seed=self.seed,
            shards=self.threads,
            blocks=screened,
        )
        self._offsets = np.cumsum([0] + [int(sh.ntotal) for sh in self.shards[:-1]]).astype(np.int64)
        if posted:
            self.posted = tuple(b.name for b in posted)
            self._columns, self._posted_columns = _columns(screened), _columns(posted)
            self._postings = build_postings(corpus, self._posted_columns)
        self.build_seconds = time.perf_counter() - t0
        log.info(
            "pq: screen of %d rows (dsub %d, blocks %s; from posting lists: %s) built in %.1f s",
            n,
            self.dsub,
            ", ".join(b.name for b in screened),
            ", ".join(self.posted) or "none",
            self.build_seconds,
        )

    def with_screen(self, screen: int) -> PqScreenBackend:
        """This backend read to another depth, sharing the built screen (no rebuild)."""
        other = copy.copy(self)
        other.screen = _positive_int(screen, "screen")
        return other

    # --- the search ------------------------------------------------------------------------------
    def _candidates(self, batch: Batch, c: int, flt: Filter) -> Candidates:
        """The screened rows with their float32 scan scores, and no bound: the screen's depth
        decided (module docstring). A selective mask takes the exact scan of its rows."""
        if self._exact is not None:
            return self._exact._candidates(batch, c, flt)
        n = self.num_docs
        if flt.mask is not None and 4 * (flt.n_allowed or 0) <= n:
            return super()._candidates(batch, c, flt)
        want = max(c, self.screen)
        if flt.mask is not None and flt.n_allowed:
            want = -(-want * n // flt.n_allowed)
        rows, scores = self._screen(batch.scan, min(want, n), self._sparse_scan(batch), flt.mask, c)
        return Candidates(rows, scores)

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The screen alone: its rows by float32 scan score (at least ``c`` of them screened)."""
        if self._exact is not None:
            return self._exact._scan(scaled, c, sparse)
        return self._screen(scaled, min(max(c, self.screen), self.num_docs), sparse, None, c)

    def _search(self, scan: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        """The screen's top ``want`` approximate scores and rows per query over every shard
        (:func:`_top_merged`): one query's shards in parallel threads (faiss releases the GIL),
        a batch's one after another (faiss spreads a batch over its queries)."""
        if len(self.shards) > 1 and scan.shape[0] == 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(len(self.shards), thread_name_prefix="esp-pq")
            parts = list(self._pool.map(lambda sh: sh.search(scan, want), self.shards))
        else:
            parts = [sh.search(scan, want) for sh in self.shards]
        return _top_merged(parts, self._offsets, want)

    def _dot(self, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
        """``(len(rows),)`` float32 scan scores of ``rows`` (ascending) from the master: faiss's
        dot on the rows in place, not BLAS on a gathered copy (no fresh pages, and OpenBLAS
        threads left spinning after a gemv would take the next screen's cores)."""
        return indexed_rows_dot(self.master, np.asarray(rows, np.int64), q, np.empty(len(rows), np.float32))

    def _posted_scores(self, queries: sp.csr_matrix, i: int) -> np.ndarray:
        """``(N,)`` float32 posted score of every row for query ``i`` of ``queries`` (its posted
        columns, csr): a scatter-add over the posting lists of the columns it has."""
        assert self._postings is not None
        out = np.zeros(self.num_docs, np.float32)
        post = self._postings
        for col, value in zip(
            queries.indices[queries.indptr[i] : queries.indptr[i + 1]],
            queries.data[queries.indptr[i] : queries.indptr[i + 1]],
            strict=True,
        ):
            lo, hi = post.indptr[col], post.indptr[col + 1]
            out[post.indices[lo:hi]] += np.float32(value) * post.data[lo:hi]  # a column's rows are unique
        return out

    def _screen(
        self, scaled: np.ndarray, want: int, sparse: SparseScan | None, mask: np.ndarray | None, c: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates of ``want`` screened rows per query (module docstring, step 1) and
        their float32 scan scores; ``c``: the candidates the refine loop needs (the posted
        blocks' extra rows are those that could enter the top ``c``)."""
        scan = np.ascontiguousarray(scaled, dtype=np.float32)
        cols = self._columns
        approx, found = self._search(scan if cols is None else np.ascontiguousarray(scan[:, cols]), want)
        posted = None
        if self._postings is not None:  # the query's nonzero posted columns, by query
            posted = sp.csr_matrix(scan[:, self._posted_columns])
        extra = None if sparse is None else sparse.top(min(self.screen, self.num_docs))
        per_rows, per_scores = [], []
        for i in range(scan.shape[0]):
            ok = found[i] >= 0
            r, a = found[i][ok], approx[i][ok]
            if len(r) < want:  # a query the codes cannot rank (all-zero): ties go to the lower rows
                pad = np.setdiff1d(np.arange(want, dtype=np.int64), r)[: want - len(r)]
                r, a = np.concatenate([r, pad]), np.concatenate([a, np.zeros(len(pad), a.dtype)])
            order = np.argsort(r)  # ascending: the dot reads the master in row order
            r, a = r[order], a[order]
            s = self._dot(r, scan[i])
            more = []
            if posted is not None:
                more.append(posted_extras(r, a, s, self._posted_scores(posted, i), c, want))
            if extra is not None:
                more.append(np.setdiff1d(extra[i][extra[i] >= 0], np.concatenate([r, *more])))
            if more:
                r2 = np.concatenate(more)
                r, s = np.concatenate([r, r2]), np.concatenate([s, self._dot(r2, scan[i])])
                order = np.argsort(r)
                r, s = r[order], s[order]
            if mask is not None:
                r, s = r[mask[r]], s[mask[r]]
            if sparse is not None:
                s = sparse.queries(slice(i, i + 1)).add_rows(s[None, :], r)[0]
            per_rows.append(r)
            per_scores.append(s)
        return stack_rows(per_rows, per_scores, width=1)

    def close(self) -> None:
        super().close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
