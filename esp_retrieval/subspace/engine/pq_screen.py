"""``pq``: approximate weighted top k from a product-quantised screen, exact re-rank on the master.

Product quantisation (Jégou, Douze and Schmid, TPAMI 2011) in faiss's 4-bit "fast scan" form
(André, Kermarrec and Le Scouarnec, VLDB 2015; ``faiss.IndexPQFastScan``): every row is
``D / dsub`` codes of 4 bits, one per ``dsub`` consecutive columns, and a query is scored
against all of them from in-register lookup tables. The score is linear in the block-scaled
query (docs/architecture.md section 1: ``score = <concat_k(w_k q_k), d>``) and the codes do not
depend on the weights: a request's weights scale the query, hence its lookup tables, so one
screen serves every weight vector. No sub-quantiser straddles two blocks (every block's offset
and width are multiples of ``dsub``), so each table entry belongs to one block's weight.

Per query the search is

1. the screen's top ``screen`` rows by approximate score (widened by ``N / allowed`` under a
   broad row mask), plus, with sparse blocks, the top ``screen`` rows of their own scan (a row
   can be in the top k by its sparse score alone);
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

from esp_retrieval.subspace.engine._gemv import indexed_rows_dot
from esp_retrieval.subspace.engine.base import Capabilities, EngineInputError
from esp_retrieval.subspace.engine.exact_fallback import ExactFallback
from esp_retrieval.subspace.engine.ivf import EXACT_BELOW
from esp_retrieval.subspace.engine.refine import Batch, Candidates, Filter, stack_rows
from esp_retrieval.subspace.engine.sparse_terms import SparseScan
from esp_retrieval.subspace.layout import SubspaceLayout

log = logging.getLogger(__name__)
_CHUNK = 65536


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineInputError(f"{name} must be an integer >= 1, got {value!r}", name)
    return value


def build_screen(
    corpus: np.ndarray, layout: SubspaceLayout, *, dsub: int, train_rows: int, seed: int, shards: int = 1
) -> list[Any]:
    """``shards`` ``faiss.IndexPQFastScan`` (inner product, 4 bits per ``dsub`` columns) over
    consecutive row ranges of ``corpus`` ``(N, D)`` float32/float16, one codebook trained on
    ``train_rows`` seeded rows. Shards let one query's screen run on several cores (faiss
    parallelises a search over its queries, not over the rows of one)."""
    import faiss

    for block in layout:
        if block.offset % dsub or block.dim % dsub:
            raise EngineInputError(
                f"dsub {dsub} must divide every block's offset and width; block {block.name!r} "
                f"spans columns {block.offset}..{block.end}",
                "dsub",
            )
    n, d = corpus.shape
    trained = faiss.IndexPQFastScan(d, d // dsub, 4, faiss.METRIC_INNER_PRODUCT)
    trained.pq.cp.min_points_per_centroid = 1  # a small corpus trains on what it has, unwarned
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, size=min(n, train_rows), replace=False))
    trained.train(np.ascontiguousarray(corpus[sample], dtype=np.float32))
    bounds = np.linspace(0, n, max(1, min(shards, n)) + 1).astype(np.int64)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        index = faiss.clone_index(trained)
        for s in range(int(lo), int(hi), _CHUNK):
            index.add(np.ascontiguousarray(corpus[s : min(s + _CHUNK, int(hi))], dtype=np.float32))
        out.append(index)
    return out


def _top_merged(parts: list[tuple[np.ndarray, np.ndarray]], offsets: np.ndarray, want: int) -> np.ndarray:
    """``(m, want)`` global rows: the best ``want`` of every shard's ``(scores, local rows)``."""
    scores = np.concatenate([np.where(i >= 0, d, -np.inf) for d, i in parts], axis=1)
    rows = np.concatenate(
        [np.where(i >= 0, i + off, -1) for (_, i), off in zip(parts, offsets, strict=True)], axis=1
    )
    if rows.shape[1] > want:
        top = np.argpartition(-scores, want - 1, axis=1)[:, :want]
        rows = np.take_along_axis(rows, top, 1)
    return rows


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
        **settings: Any,
    ) -> None:
        """``screen``: rows re-scored per query (the recall knob); ``dsub``: columns per 4-bit
        code (smaller: finer codes, a slower screen); ``train_rows``: the seeded sample the codebooks
        learn from (faiss trains each 16-centroid sub-quantiser on at most 256 x 16 = 4,096 rows);
        ``exact_below``: below this many rows the
        exact scan answers (``0``: always screen). ``settings``: the :class:`Backend` ones."""
        self.screen = _positive_int(screen, "screen")
        self.dsub = _positive_int(dsub, "dsub")
        self.train_rows = _positive_int(train_rows, "train_rows")
        self.seed = int(seed)
        self.exact_below = self._checked_exact_below(exact_below)
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
        self.shards = build_screen(
            corpus,
            self.layout,
            dsub=self.dsub,
            train_rows=self.train_rows,
            seed=self.seed,
            shards=self.threads,
        )
        self._offsets = np.cumsum([0] + [int(sh.ntotal) for sh in self.shards[:-1]]).astype(np.int64)
        self.build_seconds = time.perf_counter() - t0
        log.info("pq: screen of %d rows (dsub %d) built in %.1f s", n, self.dsub, self.build_seconds)

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
        rows, scores = self._screen(batch.scan, min(want, n), self._sparse_scan(batch), flt.mask)
        return Candidates(rows, scores)

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The screen alone: its rows by float32 scan score (at least ``c`` of them screened)."""
        if self._exact is not None:
            return self._exact._scan(scaled, c, sparse)
        return self._screen(scaled, min(max(c, self.screen), self.num_docs), sparse, None)

    def _search(self, scan: np.ndarray, want: int) -> np.ndarray:
        """The screen's top ``want`` rows per query over every shard: one query's shards in
        parallel threads (faiss releases the GIL), a batch's one after another (faiss spreads
        a batch over its queries)."""
        if len(self.shards) > 1 and scan.shape[0] == 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(len(self.shards), thread_name_prefix="esp-pq")
            parts = list(self._pool.map(lambda sh: sh.search(scan, want), self.shards))
        else:
            parts = [sh.search(scan, want) for sh in self.shards]
        return _top_merged(parts, self._offsets, want)

    def _screen(
        self, scaled: np.ndarray, want: int, sparse: SparseScan | None, mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        scan = np.ascontiguousarray(scaled, dtype=np.float32)
        found = self._search(scan, want)  # (m, want), -1 where fewer
        extra = None if sparse is None else sparse.top(min(self.screen, self.num_docs))
        per_rows, per_scores = [], []
        for i in range(scan.shape[0]):
            r = found[i][found[i] >= 0]
            if len(r) < want:  # a query the codes cannot rank (all-zero): ties go to the lower rows
                r = np.union1d(r, np.arange(want, dtype=np.int64))[:want]
            # ascending either way: the dot reads the master in row order
            r = np.sort(r) if extra is None else np.union1d(r, extra[i][extra[i] >= 0])
            if mask is not None:
                r = r[mask[r]]
            # faiss's dot on the rows in place, not BLAS on a gathered copy: no fresh pages, and
            # OpenBLAS threads left spinning after a gemv would take the next screen's cores
            s = indexed_rows_dot(self.master, np.asarray(r, np.int64), scan[i], np.empty(len(r), np.float32))
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
