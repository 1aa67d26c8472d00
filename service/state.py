"""What the service serves: one bundle with its engine and query encoder, swapped atomically.

:class:`ServingState` is immutable once built. :func:`load_state` builds a new one completely
(read + checksum-validate the bundle, build the engine, load the encoder, run a warm-up
search) before anyone sees it, so a hot reload happens *beside* the served state and the
swap in :class:`StateHolder` is one reference assignment. Every micro-batch captures the
state it started with, so requests in flight finish on the bundle they were validated against.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from service.config import Settings
from service.engine import Backend, SearchResult, create_engine
from subspace.bundle import Bundle, read_bundle
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

log = logging.getLogger(__name__)

WARMUP_TEXT = "warm-up query"


@dataclass(frozen=True, eq=False)
class ServingState:
    """A loaded, validated and warmed bundle. Thread-safe for concurrent reads."""

    bundle: Bundle
    engine: Backend
    encoder: Any | None  # encoder.query_encoder.QueryEncoder (imports torch; loaded only when present)
    docs: list[dict[str, Any]] | None
    load_seconds: float = 0.0
    loaded_at: float = field(default_factory=time.time)

    @property
    def version(self) -> str:
        return self.bundle.version

    @property
    def layout(self) -> SubspaceLayout:
        return self.bundle.layout

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

    def search(self, queries: np.ndarray, block_weights: np.ndarray, k: int) -> SearchResult:
        """``queries (nq, D)`` block-normalised, ``block_weights (K,)|(nq, K)`` -> top ``k``."""
        return self.engine.search(queries, block_weights, k)


def _load_encoder(bundle: Bundle, device: str = "auto") -> Any | None:
    if bundle.encoder_dir is None:
        return None
    from encoder.query_encoder import QueryEncoder

    return QueryEncoder.load(bundle.encoder_dir, device=device)


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
        enc = state.encode([WARMUP_TEXT])
        if enc.shape != (1, layout.dim) or not np.all(np.isfinite(enc)):
            raise ValueError(f"encoder/: warm-up encode returned shape {enc.shape} or non-finite values")
        q = np.concatenate([q, enc])
    res = state.search(q, layout.default_weights(), min(10, state.num_docs))
    if res.rows.shape[0] != q.shape[0]:
        raise ValueError(f"engine warm-up returned {res.rows.shape[0]} rows for {q.shape[0]} queries")


def load_state(path: str | Path, settings: Settings) -> ServingState:
    """Read, validate (checksums included), build engine and encoder, warm up. Blocking.

    Raises whatever is wrong (``BundleError`` naming the file, engine or encoder errors);
    nothing is swapped in by this function.
    """
    t0 = time.perf_counter()
    bundle = read_bundle(path, mmap=True, verify_checksums=True)
    engine = create_engine(
        settings.backend,
        bundle.embeddings,
        bundle.layout,
        precision=settings.precision,
        threads=settings.threads,
    )
    encoder = _load_encoder(bundle, settings.encoder_device)
    if encoder is not None:
        _check_encoder(encoder, bundle.layout)
    state = ServingState(bundle=bundle, engine=engine, encoder=encoder, docs=bundle.docs())
    warm_up(state)
    seconds = time.perf_counter() - t0
    log.info(
        "bundle %s loaded from %s: %d docs, backend %s/%s, encoder %s, %.2fs",
        bundle.version,
        bundle.path,
        state.num_docs,
        engine.name,
        engine.precision,
        "yes" if encoder is not None else "no",
        seconds,
    )
    return replace(state, load_seconds=seconds)


class StateHolder:
    """The served :class:`ServingState` (or none yet) and the last load error.

    Readers take ``holder.current`` once and keep that reference; :meth:`swap` replaces it in
    one assignment. Reloads are serialised by :attr:`reload_lock`.
    """

    def __init__(self) -> None:
        self.current: ServingState | None = None
        self.error: str | None = None
        self.reload_lock = asyncio.Lock()

    def swap(self, new: ServingState) -> ServingState | None:
        old, self.current = self.current, new
        self.error = None
        return old
