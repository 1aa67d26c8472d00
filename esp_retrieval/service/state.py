"""What the service serves: one bundle with its engine and query encoder, swapped atomically.

:class:`ServingState` is immutable once built. :func:`load_state` builds a new one completely
(read + checksum-validate the bundle, build the engine, load the encoder, run a warm-up
search) before anyone sees it, so a hot reload happens *beside* the served state and the
swap in :class:`StateHolder` is one reference assignment. Every micro-batch captures the
state it started with, so requests in flight finish on the bundle they were validated against.

Lifetime: a request holds its state (:meth:`ServingState.acquire` / :meth:`~ServingState.release`)
from validation until its answer is built. A reload *retires* the old state; the last release
of a retired state closes its engine (worker threads, faiss's copy of the corpus), so nothing
of a replaced bundle outlives the batches that use it.

What is served cannot change under the service: the bundle is read as a private snapshot
(:func:`esp_retrieval.subspace.bundle.read_bundle` with ``snapshot=True``: embeddings, ids and docs read once,
hashed as read; the query encoder built from its files' bytes, checked against the manifest's
sha256, no weight mapped from a file), its version is checked against its checksums, and a
bundle that its group or everyone may write is refused (``ESP_BUNDLE_PERMISSIONS=warn`` only logs it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from esp_retrieval.service.config import Settings
from esp_retrieval.service.engine import BACKENDS, Backend, SearchResult, SparseQuery, create_engine
from esp_retrieval.service.engine.ann import ivf_options
from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.service.search.page import display_bytes
from esp_retrieval.service.sparse_query import engine_sparse
from esp_retrieval.subspace.bundle import Bundle, BundleError, read_bundle, unreadable, writable_by_others
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.subspace.sparse import SparseLexical

log = logging.getLogger(__name__)

WARMUP_TEXT = "warm-up query"
T = TypeVar("T")


def _encoder_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="esp-encoder")


@dataclass(frozen=True, eq=False)
class ServingState:
    """A loaded, validated and warmed bundle. Thread-safe for concurrent reads."""

    bundle: Bundle
    engine: Backend
    encoder: Any | None  # encoder.query_encoder.QueryEncoder (imports torch; loaded only when present)
    docs: list[dict[str, Any]] | None
    #: the sparse blocks the engine scores (the bundle's, unless its backend cannot: then none)
    sparse: Mapping[str, SparseLexical] = field(default_factory=dict)
    load_seconds: float = 0.0
    loaded_at: float = field(default_factory=time.time)
    _life: _Lifetime = field(default_factory=lambda: _Lifetime(), repr=False)  # noqa: PLW0108 - defined below
    _encoding: ThreadPoolExecutor = field(default_factory=_encoder_thread, repr=False)

    @functools.cached_property
    def answer_floors(self) -> tuple[int, int]:
        """The shortest id and the fewest display bytes of any document: the least a hit adds to
        a response (the up-front size check, :func:`esp_retrieval.service.search.results.check_answer_size`).
        One pass over the corpus, made by :func:`load_state` on the loader thread, not at a search."""
        shortest = min(map(len, self.bundle.ids), default=0)
        display = min(map(display_bytes, self.docs), default=0) if self.docs else 0
        return shortest, display

    def acquire(self) -> bool:
        """Count one more user; ``False`` (nothing counted) when the state is already closed."""
        life = self._life
        with life.lock:
            if life.closed:
                return False
            life.users += 1
            return True

    def release(self) -> None:
        """One user fewer; the last one of a retired state closes it."""
        life = self._life
        with life.lock:
            life.users -= 1
            close = life.retired and life.users <= 0 and not life.closed
            life.closed = life.closed or close
        if close:
            self._close()

    def retire(self) -> None:
        """No new user will come (the state was replaced): close now, or at the last release."""
        life = self._life
        with life.lock:
            life.retired = True
            close = life.users <= 0 and not life.closed
            life.closed = life.closed or close
        if close:
            self._close()

    @property
    def closed(self) -> bool:
        return self._life.closed

    def _close(self) -> None:
        self._encoding.shutdown(wait=False)  # its thread ends once its last encode returns
        try:
            self.engine.close()
        except Exception:  # closing must never fail a request
            log.exception("closing the engine of bundle %s failed", self.version)
        log.info("bundle %s retired: engine %s closed", self.version, self.engine.name)

    @property
    def version(self) -> str:
        return self.bundle.version

    @property
    def layout(self) -> SubspaceLayout:
        return self.bundle.layout

    @property
    def weight_layout(self) -> SubspaceLayout:
        """The names a request's weights may carry: the layout's blocks, then the bundle's sparse
        blocks (:attr:`esp_retrieval.subspace.bundle.Bundle.weight_layout`, served or not)."""
        return self.bundle.weight_layout

    @property
    def num_docs(self) -> int:
        return len(self.bundle.ids)

    @property
    def dtype(self) -> str:
        return str(self.bundle.manifest["corpus"]["dtype"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Texts -> ``(n, D)`` float32 block-normalised query vectors."""
        if self.encoder is None:
            raise RuntimeError(f"bundle {self.version} has no query encoder")
        return np.asarray(self.encoder.encode(list(texts)), dtype=np.float32)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Document texts -> ``(n, D)`` float32 block-normalised vectors, through the bundle's
        document encoder (:meth:`encoder.QueryEncoder.encode_documents`: the corpus's side,
        today the same network as the queries'); what a live write of a text is stored as."""
        if self.encoder is None:
            raise RuntimeError(f"bundle {self.version} has no encoder")
        return np.asarray(self.encoder.encode_documents(list(texts)), dtype=np.float32)

    def encoder_job(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` (work that calls the encoder) queued on this bundle's one encoder thread,
        the state held until it has run, or until it is cancelled before it started. One thread,
        because torch already spreads one encode over every core (two at once only contend), and
        every thread that runs torch on CPU starts an OpenMP team of its own that lives as long
        as the thread: here one team per bundle, ended with it, not one per thread of the
        blocking pool. Searches encode their text queries on the micro-batcher's engine thread
        instead."""
        if not self.acquire():  # retired and closed since the caller took it
            raise NotReadyError("the served bundle was just replaced; retry", retry_after=1.0)
        try:
            future = self._encoding.submit(fn, *args)
        except BaseException:
            self.release()
            raise
        future.add_done_callback(lambda _: self.release())
        return future

    async def in_encoder_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`encoder_job`, awaited."""
        return await asyncio.wrap_future(self.encoder_job(fn, *args))

    def search(
        self, queries: np.ndarray, block_weights: np.ndarray, k: int,
        sparse: Mapping[str, SparseQuery] | None = None,
    ) -> SearchResult:
        """``queries (nq, D)`` block-normalised, ``block_weights (K,)|(nq, K)`` -> top ``k``;
        ``sparse``: the served sparse blocks' queries and weights (:mod:`service.sparse_query`)."""
        if sparse is None:
            return self.engine.search(queries, block_weights, k)
        return self.engine.search(queries, block_weights, k, sparse=sparse)


class _Lifetime:
    """Users of one :class:`ServingState`, and whether it is retired or closed (any thread)."""

    __slots__ = ("closed", "lock", "retired", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.retired = False
        self.closed = False


def _load_encoder(bundle: Bundle, device: str = "auto") -> Any | None:
    if bundle.encoder_dir is None:
        return None
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    # the bytes built from are checked against the manifest: nothing served is mapped from a file
    return QueryEncoder.load(bundle.encoder_dir, device=device, digests=bundle.encoder_digests)


def _check_encoder(encoder: Any, layout: SubspaceLayout) -> None:
    enc_layout = getattr(encoder, "layout", None)
    if enc_layout is not None and enc_layout.to_dict() != layout.to_dict():
        raise ValueError(
            "encoder/: the query encoder's layout differs from the manifest's layout "
            f"({list(enc_layout.names)} {list(enc_layout.dims)} vs {list(layout.names)} {list(layout.dims)})"
        )


def warm_up(state: ServingState) -> None:
    """One search (and one encode when there is an encoder) so the first caller pays nothing."""
    state.engine.warmup()
    layout = state.layout
    q = normalize_blocks(np.random.default_rng(0).standard_normal((1, layout.dim)).astype(np.float32), layout)
    if state.encoder is not None:
        enc = state._encoding.submit(state.encode, [WARMUP_TEXT]).result()  # its OpenMP team starts now
        if enc.shape != (1, layout.dim) or not np.all(np.isfinite(enc)):
            raise ValueError(f"encoder/: warm-up encode returned shape {enc.shape} or non-finite values")
        q = np.concatenate([q, enc])
    sparse = None
    if state.encoder is not None:  # the encoded text's sparse vectors too (service.sparse_query)
        texts: list[str | None] = [None] * (q.shape[0] - 1) + [WARMUP_TEXT]
        sparse = engine_sparse(state.sparse, texts, np.ones((q.shape[0], len(state.sparse))))
    res = state.search(q, layout.default_weights(), min(10, state.num_docs), sparse=sparse)
    if res.rows.shape[0] != q.shape[0]:
        raise ValueError(f"engine warm-up returned {res.rows.shape[0]} rows for {q.shape[0]} queries")


def _some(paths: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` paths, quoted, and how many more there are."""
    more = f" (+{len(paths) - shown} more)" if len(paths) > shown else ""
    return ", ".join(repr(p) for p in paths[:shown]) + more


def check_permissions(path: Path, settings: Settings) -> None:
    """Refuse a bundle this process cannot read (naming the files and the fix), and refuse (or,
    with ``bundle_permissions="warn"``, log) one others may write."""
    closed = unreadable(path) if path.is_dir() else []
    if closed:
        raise BundleError(
            f"{_some(closed)}: not readable by uid {os.getuid()}, which serves the bundle (another uid "
            "wrote it with private modes; this version writes files 0644 and folders 0755: rewrite "
            "it, or chmod -R a+rX,go-w the bundle)"
        )
    loose = writable_by_others(path)
    if not loose:
        return
    message = (
        f"{_some(loose)}: writable by group or others, so someone else could change what is served "
        "(chmod go-w; or set ESP_BUNDLE_PERMISSIONS=warn to serve it anyway)"
    )
    if settings.bundle_permissions == "refuse":
        raise BundleError(message)
    log.warning("bundle at %r: %s", str(path), message)


def engine_sparse_blocks(bundle: Bundle, backend: str) -> dict[str, SparseLexical]:
    """The bundle's sparse blocks for the engine: all of them, or none for a backend named
    explicitly whose capabilities lack ``sparse`` (faiss, cupy, ivf, milvus). That one serves the
    dense blocks as before (logged), and refuses a search that weighs a sparse block
    (:func:`esp_retrieval.service.sparse_query.check`). ``auto`` gets them: its chain skips such backends."""
    blocks = dict(bundle.sparse)
    cls = BACKENDS.get(backend)
    if blocks and cls is not None and not cls.capabilities.sparse:
        log.warning(
            "bundle %s: backend %s cannot score sparse blocks (its capabilities lack sparse): serving %s "
            "without them; a search that weighs them is refused", bundle.version, backend, list(blocks),
        )
        return {}
    return blocks


def load_state(path: str | Path, settings: Settings) -> ServingState:
    """Read, validate (checksums included), build engine and encoder, warm up. Blocking.

    Raises whatever is wrong (``BundleError`` naming the file, engine or encoder errors);
    nothing is swapped in by this function.
    """
    t0 = time.perf_counter()
    check_permissions(Path(path), settings)
    bundle = read_bundle(path, snapshot=True, verify_checksums=True)
    sparse = engine_sparse_blocks(bundle, settings.backend)
    engine = create_engine(
        settings.backend,
        bundle.embeddings,
        bundle.layout,
        precision=settings.precision,
        threads=settings.threads,
        options={"ivf": functools.partial(ivf_options, bundle, settings.ann_max_touched)},
        sparse_blocks=sparse,
    )
    state: ServingState | None = None
    try:
        encoder = _load_encoder(bundle, settings.encoder_device)
        if encoder is not None:
            _check_encoder(encoder, bundle.layout)
        state = ServingState(bundle=bundle, engine=engine, encoder=encoder, docs=bundle.docs(), sparse=sparse)
        warm_up(state)
    except BaseException:
        engine.close()  # a refused bundle leaves nothing running
        if state is not None:
            state._encoding.shutdown(wait=False)
        raise
    seconds = time.perf_counter() - t0
    log.info(
        "bundle %s loaded from %r: %d docs, backend %s/%s, encoder %s, %.2fs",
        bundle.version,
        str(bundle.path),
        state.num_docs,
        engine.name,
        engine.precision,
        "yes" if encoder is not None else "no",
        seconds,
    )
    state = replace(state, load_seconds=seconds)
    _ = state.answer_floors  # here, off the event loop
    return state


class StateHolder:
    """The served :class:`ServingState` (or none yet) and the last load error.

    Readers take ``holder.current`` once and keep that reference; :meth:`swap` replaces it in
    one assignment. Reloads are serialised by :attr:`reload_lock`.
    """

    def __init__(self) -> None:
        self.current: ServingState | None = None
        self.error: str | None = None
        self.reload_lock = asyncio.Lock()

    def require(self) -> ServingState:
        """The state served now, for one request to keep; :class:`NotReadyError` (503) when none is."""
        state = self.current
        if state is None:
            raise NotReadyError(f"not ready: {self.error or 'the bundle is still loading'}", retry_after=1.0)
        return state

    def swap(self, new: ServingState) -> ServingState | None:
        old, self.current = self.current, new
        self.error = None
        return old
