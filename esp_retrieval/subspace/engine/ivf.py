"""``ivf``: weighted top k from a weight-aware inverted-file index, exact re-rank on the master.

The index (:mod:`esp_retrieval.subspace.engine.ivf_index`) holds several coarse partitions of the corpus
(all blocks together, and one per block by default). For a query ``q`` with weights ``w``
(docs/architecture.md section 1: ``score = <concat_k(w_k q_k), d>``) every list ``j`` of
every partition gets, from its stored summary and the block-scaled query alone,

* ``mu_j = <q~, mean_j>``: the mean score of its members, exactly;
* ``sigma_j = sqrt(sum_d q~_d^2 var_jd)``: their spread under a diagonal model;
* ``ub_j = sum_k (<q~_k, mean_jk> + |q~_k| r_jk)``: an upper bound on every member's score.

The search runs in rounds. Round one scans the best lists of every partition by
``mu + 2 sigma``; then, with ``t`` the k-th best score seen so far, the expected number of
members above ``t`` in a list is ``E_j = n_j P(N(mu_j, sigma_j) >= t)`` (0 where ``ub_j < t``).
A document is missed only if it lies in an unprobed list of *every* partition, so a round
probes the partition with the smallest expected remainder ``sum E_j`` (the one whose geometry
follows the request's weights: the intent partition when intent dominates, the joint one
for mixed weights), its lists in decreasing ``E_j``. The search stops

* **exactly** when one partition has no unprobed list that can reach ``t`` (every remaining
  ``ub_j < t``): the result then equals the exhaustive scan's;
* approximately (``max_touched`` set) when that partition's expected remainder is below
  ``target_misses`` or the rows scanned reach ``max_touched * N``.

Without ``max_touched`` (the default, and what the shared engine tests run) only the exact
stop applies (a partition is finished when the bounds do not end the search first), so the
backend keeps the engine contract. Lists are scanned from their codes (``int8`` or
``float32``), the candidates within the scan's roundoff of the k-th are re-ranked in float64
on the master, and per-hit subspace scores come from the master as for every backend.
``last_stats`` holds the rows scanned and whether each query of the last search was exact.

**Sparse blocks** (a BM25 block beside the dense ones, :mod:`~esp_retrieval.subspace.engine.sparse_terms`):
every scanned row gets its sparse score added, every list's bound grows by the query's sparse
reach ``sum_s w_s sum_t |q_t| max|d_t|`` and ``eps`` by the sparse term's rounding, so the exact
stop stays exact (with a loose bound: a large sparse weight keeps lists open). In the
approximate mode the rows with the highest sparse scores join the candidates, as a row can lead
by its sparse score alone from a list the probing left. The sparse scores are held dense per
query during a search (``4 N`` bytes a query).

**Exact where the index cannot win.** With ``max_touched`` set, a corpus of fewer than
``exact_below`` rows (:data:`EXACT_BELOW`), or a budget of at least ``exact_above``
(:data:`EXACT_ABOVE`) of the corpus, is answered by the numpy backend's exact scan instead: at
that size the probing's fixed cost (the per-list summaries, the rounds) exceeds one scan of the
corpus (``bench/ann.py --quick``, 30k rows: the probing was slower than the exact scan on the
slowest weight vector). The choice is made once, logged, and shown as ``fallback`` (the reason)
and in ``last_stats.mode`` (``"exact"``); no index is built for it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
from scipy.special import log_ndtr

from esp_retrieval.subspace.engine._gemv import rows_dot
from esp_retrieval.subspace.engine.base import Capabilities, EngineInputError
from esp_retrieval.subspace.engine.exact_fallback import ExactFallback
from esp_retrieval.subspace.engine.ivf_index import IvfIndex, IvfIndexError, IvfParams, build_index
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend, blas_limiter
from esp_retrieval.subspace.engine.refine import Batch, Candidates, Filter, stack_rows
from esp_retrieval.subspace.engine.sparse_terms import SparseScan
from esp_retrieval.subspace.layout import SubspaceLayout

_U32 = 2.0**-24
#: below this many rows an approximate search takes the exact scan (measured: README, "Approximate")
EXACT_BELOW = 50_000
#: a budget of at least this fraction of the corpus costs more in lists than one exact scan
EXACT_ABOVE = 0.5


def _log_tail(z: np.ndarray, kind: str) -> np.ndarray:
    """``log P(X >= mu + z sigma)`` for a unit-variance law: ``gauss``, or ``laplace`` (heavier
    tails). In logs, so lists far in the tail still rank among themselves."""
    if kind == "gauss":
        return np.asarray(log_ndtr(-z))
    r2 = np.sqrt(2.0)
    return np.where(z > 0, np.log(0.5) - r2 * z, np.log1p(-0.5 * np.exp(r2 * np.minimum(z, 0.0))))


TAILS = ("gauss", "laplace")


class SparseTerm(NamedTuple):
    """A batch's sparse blocks as the probing adds them (score units)."""

    scores: np.ndarray  # (m, N) float32: sum_s w_s <q_s, d_s> of every row (0 where no term matches)
    reach: np.ndarray  # (m,) no row's sparse term exceeds it
    eps: np.ndarray  # (m,) bound on the rounding of ``scores``
    scan: SparseScan  # the same scores, stored sparse (their top rows without a pass over N)


@dataclass
class SearchStats:
    """Per query of the last search: rows scanned (duplicates across partitions counted), exact?"""

    touched: np.ndarray  # (nq,) int64
    exact: np.ndarray  # (nq,) bool: stopped by the bound (or a finished partition)
    rounds: int
    mode: str = "ivf"  # "exact": the exact scan answered (the backend's ``fallback``)


class IvfBackend(ExactFallback):
    name: ClassVar[str] = "ivf"
    precisions: ClassVar[tuple[str, ...]] = ("float32",)
    capabilities: ClassVar[Capabilities] = Capabilities(approximate=True, sparse=True)  # with max_touched
    _pool: ThreadPoolExecutor | None = None

    def __init__(
        self,
        corpus: np.ndarray,
        layout: SubspaceLayout,
        *,
        index: IvfIndex | None = None,
        params: IvfParams | None = None,
        max_touched: float | None = None,
        target_misses: float = 0.0,
        first_fraction: float = 0.004,
        step_fraction: float = 0.004,
        spread: float = 1.0,
        tail: str = "gauss",
        exact_below: int = EXACT_BELOW,
        exact_above: float = EXACT_ABOVE,
        **settings: Any,
    ) -> None:
        """``settings``: the :class:`Backend` ones (``precision``, ``threads``, ``chunk_rows``);
        ``exact_below`` / ``exact_above``: when the exact scan answers instead (module docstring;
        ``exact_below=0`` always probes)."""
        if max_touched is not None and (
            isinstance(max_touched, bool)
            or not isinstance(max_touched, int | float)
            or not 0 < max_touched <= 1
        ):
            raise EngineInputError(
                f"max_touched must be in (0, 1] or None, got {max_touched!r}", "max_touched"
            )
        if isinstance(target_misses, bool) or not isinstance(target_misses, int | float) or target_misses < 0:
            raise EngineInputError(f"target_misses must be >= 0, got {target_misses!r}", "target_misses")
        self._given_index = index
        self._params = params
        self.max_touched = max_touched
        self.target_misses = float(target_misses)
        self.first_fraction = first_fraction
        self.step_fraction = step_fraction
        self.spread = float(spread)
        if tail not in TAILS:
            raise EngineInputError(f"tail {tail!r} is unknown; allowed: {list(TAILS)}", "tail")
        self.tail = tail
        self.exact_below = self._checked_exact_below(exact_below)
        self.exact_above = float(exact_above)
        #: why the exact scan answers every query (``None``: the index does)
        self.fallback: str | None = None
        self._exact: NumpyBackend | None = None
        self.last_stats: SearchStats | None = None
        self._pool: ThreadPoolExecutor | None = None
        super().__init__(corpus, layout, **settings)

    # --- load ---------------------------------------------------------------------------------
    def _fallback_reason(self, n: int) -> str | None:
        if self.max_touched is None:
            return None  # exact mode: the probing is exact already
        if n < self.exact_below:
            return f"{n} rows < exact_below {self.exact_below}"
        if self.max_touched >= self.exact_above:
            return f"max_touched {self.max_touched} >= exact_above {self.exact_above}"
        return None

    def _load(self, corpus: np.ndarray) -> None:
        reason = self._fallback_reason(corpus.shape[0])
        if reason is not None:
            self._start_exact(corpus, reason)
            if self._given_index is None:
                return  # no index to build
        index = (
            self._given_index
            if self._given_index is not None
            else build_index(corpus, self.layout, self._params)
        )
        if index.num_docs != corpus.shape[0] or index.layout.to_dict() != self.layout.to_dict():
            raise IvfIndexError(
                f"the index was built for {index.num_docs} rows of layout {list(index.layout.names)}, "
                f"the corpus has {corpus.shape[0]} rows of {list(self.layout.names)}",
                "index",
            )
        self.index = index
        parts = index.partitions
        self._means64 = np.concatenate([p.means for p in parts]).astype(np.float64)  # (Lt, D)
        self._means32 = np.ascontiguousarray(self._means64.astype(np.float32))
        self._vars = np.ascontiguousarray(np.concatenate([p.variances for p in parts]))  # (Lt, D)
        self._radii = np.concatenate([p.radii for p in parts])  # (Lt, K)
        self._sizes = np.concatenate([p.sizes for p in parts]).astype(np.int64)
        self._starts = np.concatenate([p.offsets[:-1] for p in parts]).astype(np.int64)
        self._part_of = np.concatenate([np.full(p.nlist, i) for i, p in enumerate(parts)])
        self._part_starts = np.concatenate([[0], np.cumsum([p.nlist for p in parts])]).astype(np.int64)
        self._qscale = 1.0 / index.scale.astype(np.float64)  # query multiplier against codes
        self._int8 = index.list_dtype == "int8"
        self._peak = 127.0 / index.scale.astype(np.float64) if self._int8 else None
        self._buf_rows = int(self._sizes.max()) if len(self._sizes) else 1

    # --- the search ------------------------------------------------------------------------------
    def _candidates(self, batch: Batch, c: int, flt: Filter) -> Candidates:
        """The probed lists' rows within the scan's roundoff of the k-th (final: the probing's
        own stop rule decided, exactly unless ``max_touched`` is set).

        A selective mask (at most a quarter of the rows) is answered by the exact scan of its
        rows (:class:`Backend`'s); a broad one keeps only allowed rows among the probed members.
        With a ``fallback``, the numpy backend's exact candidates (and their bound).
        """
        if self._exact is not None:
            nq = batch.scan.shape[0]
            self.last_stats = SearchStats(
                np.full(nq, self.num_docs, np.int64), np.ones(nq, bool), 0, mode="exact"
            )
            return self._exact._candidates(batch, c, flt)
        if flt.mask is not None and 4 * (flt.n_allowed or 0) <= self.num_docs:
            return super()._candidates(batch, c, flt)
        term = None if batch.sparse is None else self._sparse_term(batch)
        rows, _ = stack_rows(*self._probe(batch.scaled64, batch.k, flt.mask, term), width=batch.k)
        if term is not None and self.max_touched is not None:
            # approximate: a row can lead by its sparse score alone, in a list the probing left
            top = term.scan.top(min(max(c, batch.k), self.num_docs))
            if flt.mask is not None:
                top = np.where(flt.mask[np.maximum(top, 0)], top, -1)
            merged = [np.unique(r[r >= 0]) for r in np.concatenate([rows, top], axis=1)]
            rows, _ = stack_rows(merged, [np.zeros(len(r), np.float32) for r in merged], width=1)
        return Candidates(rows)

    def _sparse_term(self, batch: Batch) -> SparseTerm:
        """The batch's sparse blocks in score units (not the scan's ``factor``), dense per row."""
        assert batch.sparse is not None
        assert self.sparse_blocks is not None
        scan = self.sparse_blocks.scan(batch.sparse, np.ones(batch.scan.shape[0]))
        return SparseTerm(
            scores=scan.dense(),
            reach=batch.sparse.bound(),
            eps=batch.sparse.scan_error(np.asarray(batch.bound, np.float64)),
            scan=scan,
        )

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The probing alone: top ``c`` by scan score among the rows the probing scanned."""
        if self._exact is not None:
            return self._exact._scan(scaled, c, sparse)
        if sparse is not None:
            raise NotImplementedError("ivf: the probing takes sparse blocks through _candidates")
        return stack_rows(*self._probe(np.asarray(scaled, np.float64), min(c, self.num_docs)))

    def _code_eps(self, scaled64: np.ndarray) -> np.ndarray:
        """Per query: bound on ``|scan score - exact score|`` (code rounding + float32 sums)."""
        absq = np.abs(scaled64)
        if self._int8:
            assert self._peak is not None
            quant = 0.5 * (absq @ self._qscale)
            mag = absq @ self._peak
        else:
            quant = np.zeros(len(scaled64))
            blocks = np.sqrt((scaled64**2) @ self._indicator)
            mag = blocks @ self._max_block_norm
        return quant * (1 + 1e-6) + 2.0 * (self.dim + 4) * _U32 * mag + 1e-12

    def _probe(
        self, scaled64: np.ndarray, kk: int, mask: np.ndarray | None = None, sparse: SparseTerm | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Run the rounds; per query the scanned rows within ``2 eps`` of the k-th scan score.

        ``sparse``: the sparse blocks' scores are added to every scanned row's, and their reach
        to every list's bound and to ``eps`` their rounding, so the exact stop stays exact."""
        nq, n = scaled64.shape[0], self.num_docs
        P = len(self.index.partitions)
        lt = len(self._sizes)
        scaled32 = scaled64.astype(np.float32)
        qcodes = (scaled64 * self._qscale).astype(np.float32)  # queries against the codes
        blocknorm = np.sqrt((scaled64**2) @ self._indicator)  # (nq, K) = w_k |q_k|
        cap = blocknorm @ self._max_block_norm  # no dense score exceeds this
        mu = scaled64 @ self._means64.T  # (nq, Lt)
        reach = np.zeros(nq) if sparse is None else sparse.reach  # no sparse term exceeds this
        ub = np.minimum(mu + blocknorm @ self._radii.T, cap[:, None]) + reach[:, None]
        ub += 1e-9 * (1.0 + cap[:, None] + reach[:, None])
        sigma = self.spread * np.sqrt(np.maximum((scaled32 * scaled32) @ self._vars.T, 0.0)).astype(
            np.float64
        )
        sigma += 1e-12
        eps = self._code_eps(scaled64) + (0.0 if sparse is None else sparse.eps)

        probed = np.zeros((nq, lt), bool)
        touched = np.zeros(nq, np.int64)
        exact = np.zeros(nq, bool)
        active = np.ones(nq, bool)
        t = np.full(nq, -np.inf)  # k-th best scan score so far (distinct rows)
        pool_rows: list[list[np.ndarray]] = [[] for _ in range(nq)]
        pool_scores: list[list[np.ndarray]] = [[] for _ in range(nq)]
        band_rows: list[np.ndarray] = [np.empty(0, np.int64)] * nq
        band_scores: list[np.ndarray] = [np.empty(0, np.float32)] * nq
        budget = n if self.max_touched is None else max(kk, int(np.ceil(self.max_touched * n)))
        first = max(kk, int(self.first_fraction * n))
        all_q = np.ones(nq, bool)
        step = max(kk, int(self.step_fraction * n))

        # round one: every partition's best lists by mu + 2 sigma, the first rows shared out
        pairs_q: list[np.ndarray] = []
        pairs_l: list[np.ndarray] = []
        for p in range(P):
            a, b = self._part_starts[p], self._part_starts[p + 1]
            qp, lp = self._take(mu[:, a:b] + 2.0 * sigma[:, a:b], self._sizes[a:b], max(1, first // P), all_q)
            pairs_q.append(qp)
            pairs_l.append(lp + a)
        qi, lj = np.concatenate(pairs_q), np.concatenate(pairs_l)
        part_touched = np.zeros((nq, P), np.int64)
        rounds = 0
        while True:
            rounds += 1
            probed[qi, lj] = True
            np.add.at(touched, qi, self._sizes[lj])
            np.add.at(part_touched, (qi, self._part_of[lj]), self._sizes[lj])
            floor = t - 2.0 * eps
            self._scan_pairs(
                qcodes,
                qi=qi,
                lj=lj,
                floor=floor,
                mask=mask,
                sparse=None if sparse is None else sparse.scores,
                pool_rows=pool_rows,
                pool_scores=pool_scores,
            )
            for i in np.unique(qi).tolist():
                band_rows[i], band_scores[i], t[i] = self._band(
                    [band_rows[i], *pool_rows[i]], [band_scores[i], *pool_scores[i]], kk, eps[i]
                )
                pool_rows[i], pool_scores[i] = [], []
            # stop tests, per active query
            idx = np.flatnonzero(active)
            thr = (t[idx] - eps[idx])[:, None]
            open_ = ~probed[idx] & (ub[idx] >= thr)  # unprobed lists that could still reach the top k
            open_count = np.add.reduceat(open_, self._part_starts[:-1], axis=1)  # (m, P)
            done_exact = (open_count == 0).any(axis=1)
            z = (thr - mu[idx]) / sigma[idx]
            log_expect = np.log(np.maximum(self._sizes, 1)) + _log_tail(z, self.tail)
            expect = np.where(open_, np.exp(log_expect), 0.0)
            remain = np.add.reduceat(expect, self._part_starts[:-1], axis=1)  # (m, P)
            # a partition with no open list has nothing left to find; otherwise its expected misses
            remain = np.where(open_count == 0, 0.0, remain)
            exact[idx] = done_exact
            stop = done_exact.copy()
            if self.max_touched is not None:
                enough = np.array([len(band_rows[i]) >= kk for i in idx.tolist()], bool)
                stop |= enough & ((remain.min(axis=1) < self.target_misses) | (touched[idx] >= budget))
            active[idx[stop]] = False
            if not active.any():
                break
            keep = ~stop
            idx, open_, log_expect = idx[keep], open_[keep], log_expect[keep]
            open_rows = np.add.reduceat(np.where(open_, self._sizes, 0), self._part_starts[:-1], axis=1)
            # the budget is shared out evenly: the open partition with the fewest rows scanned
            # so far; past the budget (exact mode only) the one with the fewest open rows is finished
            over = touched[idx] >= budget
            big = np.iinfo(np.int64).max
            choice = np.where(
                over,
                np.argmin(np.where(open_rows > 0, open_rows, big), 1),
                np.argmin(np.where(open_rows > 0, part_touched[idx], big), 1),
            )
            lists_part = self._part_of[None, :] == choice[:, None]
            # rank by expected members above t (in logs: positive keys, 0 = not a candidate)
            cand = open_ & lists_part
            low = np.where(cand, log_expect, np.inf).min(axis=1, keepdims=True)
            key = np.where(over[:, None], 1.0, log_expect - np.where(np.isfinite(low), low, 0.0) + 1.0)
            score = np.where(cand, key, 0.0)
            amount = np.where(over, n, np.maximum(step, touched[idx]))
            # exact mode, past the budget, or fewer than k rows found: at least one list
            has_k = np.array([len(band_rows[i]) >= kk for i in idx.tolist()], bool)
            room = (budget - touched[idx]).astype(np.float64)
            first_limit = np.where(over | ~has_k | (self.max_touched is None), np.inf, room)
            if self.max_touched is not None:  # else never past the budget
                amount = np.maximum(0, np.minimum(amount, room))
            # within the budget, a list that does not fit ends the query's search; past it (exact
            # mode) every open list of the chosen partition is taken
            qi_local, lj = self._take(
                score, self._sizes, amount, score.max(axis=1) > 0, positive_only=True, first_limit=first_limit
            )
            qi = idx[qi_local]
            starved = np.ones(len(idx), bool)
            starved[qi_local] = False
            active[idx[starved]] = False
            if len(qi) == 0:
                break
        self.last_stats = SearchStats(touched, exact, rounds)
        return band_rows, band_scores

    @staticmethod
    def _take(
        score: np.ndarray,
        sizes: np.ndarray,
        amount: Any,
        rows_mask: np.ndarray,
        *,
        positive_only: bool = False,
        first_limit: Any = np.inf,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``score`` ``(m, L)`` (rows where ``rows_mask``): the best lists (only those
        scoring > 0 when ``positive_only``) whose sizes add up to at most ``amount`` rows; the
        best one even when larger, if it has at most ``first_limit`` rows. Returns ``(row, list)`` pairs."""
        m, L = score.shape
        amount = np.broadcast_to(np.asarray(amount), (m,))
        need = int(np.ceil(amount.max() / max(1.0, float(sizes.min(initial=1))))) + 1
        top = min(L, max(1, need))
        if top < L:
            cand = np.argpartition(-score, top - 1, axis=1)[:, :top]
        else:
            cand = np.broadcast_to(np.arange(L), (m, L))
        cs = np.take_along_axis(score, cand, 1)
        o = np.argsort(-cs, axis=1, kind="stable")
        cand = np.take_along_axis(cand, o, 1)
        cs = np.take_along_axis(cs, o, 1)
        sz = sizes[cand]
        after = np.cumsum(sz, axis=1)
        first = (after == sz) & (sz <= np.broadcast_to(np.asarray(first_limit), (m,))[:, None])
        take = ((after <= amount[:, None]) | first) & rows_mask[:, None]
        if positive_only:
            take &= cs > 0
        qi, pos = np.nonzero(take)
        return qi, cand[qi, pos]

    def _scan_pairs(
        self,
        qcodes: np.ndarray,
        *,
        qi: np.ndarray,
        lj: np.ndarray,
        floor: np.ndarray,
        mask: np.ndarray | None,
        sparse: np.ndarray | None,
        pool_rows: list[list[np.ndarray]],
        pool_scores: list[list[np.ndarray]],
    ) -> None:
        """Scan list ``lj[i]`` for query ``qi[i]``; keep entries at or above the query's floor."""
        o = np.argsort(lj, kind="stable")
        qi, lj = qi[o], lj[o]
        bounds = np.flatnonzero(np.diff(lj)) + 1
        groups = np.split(np.arange(len(lj)), bounds)
        parts = self.index.partitions

        def work(chunk: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
            buf = np.empty((self._buf_rows, self.dim), np.float32)
            out = []
            for g in chunk:
                j = int(lj[g[0]])
                p = parts[int(self._part_of[j])]
                a = int(self._starts[j])
                b = a + int(self._sizes[j])
                if b == a:
                    continue
                block = p.codes[a:b]
                if block.dtype != np.float32:
                    rows32 = buf[: b - a]
                    np.copyto(rows32, block)
                else:
                    rows32 = block
                qs = qi[g]
                if len(qs) == 1:
                    s = np.empty((1, b - a), np.float32)
                    rows_dot(rows32, qcodes[qs[0]], s[0])
                else:
                    s = qcodes[qs] @ rows32.T
                if sparse is not None:
                    s += sparse[np.ix_(qs, p.order[a:b])]
                out.append((qs, p.order[a:b], s))
            return out

        nworkers = min(self.threads, len(groups))
        if nworkers > 1 and len(lj) >= 4:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="esp-ivf")
            chunks = [groups[w::nworkers] for w in range(nworkers)]
            with blas_limiter(1) if len(lj) > len(groups) else nullcontext():
                results = [r for part in self._pool.map(work, chunks) for r in part]
        else:
            results = work(groups)
        for qs, order, s in results:
            ok = None if mask is None else mask[order]
            for row, qidx in enumerate(qs.tolist()):
                keep = s[row] >= floor[qidx]
                if ok is not None:
                    keep &= ok
                if keep.any():
                    pool_rows[qidx].append(order[keep])
                    pool_scores[qidx].append(s[row][keep])

    @staticmethod
    def _band(
        rows_list: list[np.ndarray], scores_list: list[np.ndarray], kk: int, eps: float
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Distinct rows (best scan score each), the k-th score, and the rows within ``2 eps``."""
        rows = np.concatenate(rows_list)
        scores = np.concatenate(scores_list)
        if len(rows) == 0:
            return rows, scores, -np.inf
        o = np.lexsort((-scores, rows))
        rows, scores = rows[o], scores[o]
        first = np.ones(len(rows), bool)
        first[1:] = rows[1:] != rows[:-1]
        rows, scores = rows[first], scores[first]
        if len(rows) < kk:
            return rows, scores, -np.inf
        kth = float(np.partition(scores, len(scores) - kk)[len(scores) - kk])
        keep = scores.astype(np.float64) >= kth - 2.0 * eps
        return rows[keep], scores[keep], kth

    def close(self) -> None:
        super().close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __del__(self) -> None:
        self.close()
