"""Frozen-trunk feature cache: pooled trunk features computed once, reused across runs.

With a frozen trunk the only expensive step is the transformer forward pass, and its output
(mean-pooled ``(n, H)`` float32) depends only on the trunk weights, tokenizer settings and the
texts. The cache key is a sha256 over exactly those, so a changed model, ``max_length`` or
text list never reads a stale entry. Entries are ``<key>.npy`` written atomically
(:func:`esp_retrieval.subspace.atomic.atomic_open`) and read with ``allow_pickle=False``.

Read-only folders with entries of the same format are looked up first and never written: the
repository ships the default trunk's features of the TREC DL pool in ``data/trunk-features``
(:data:`SHIPPED_DIR`), which turn the demo's cold MiniLM pass over the pool into a file read.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from esp_retrieval.subspace.atomic import atomic_open
from esp_retrieval.subspace.lexical import texts_digest  # re-exported: run.py's data hashes
from esp_retrieval.training.data import DEFAULT_DATA_DIR
from esp_retrieval.training.model import Trunk

#: precomputed features shipped with the repository (see its SOURCE.txt); relative to the data folder
SHIPPED_SUBDIR = "trunk-features"
SHIPPED_DIR = DEFAULT_DATA_DIR / SHIPPED_SUBDIR

#: ``texts -> (n, H)`` pooled trunk features (a :class:`FeatureStore` or the trunk's forward pass)
Pooled = Callable[[list[str]], torch.Tensor]

log = logging.getLogger(__name__)


def trunk_fingerprint(trunk: Trunk) -> str:
    """sha256 of the trunk's weights (names, shapes, bytes), tokenizer vocabulary size and max_length."""
    h = hashlib.sha256()
    for name, tensor in sorted(trunk.model.state_dict().items()):
        t = tensor.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    h.update(f"mean|{trunk.max_length}|{len(trunk.tokenizer)}".encode())
    return h.hexdigest()


CHUNK = 2048


def chunk_name(fingerprint: str, texts: Sequence[str]) -> str:
    """File name of one cached chunk: a hash of the trunk fingerprint and the chunk's texts."""
    key = hashlib.sha256(f"{fingerprint}|{texts_digest(texts)}".encode()).hexdigest()[:32]
    return f"{key}.npy"


def _load(path: Path, shape: tuple[int, int], desc: str) -> np.ndarray | None:
    if not path.is_file():
        return None
    try:
        feats = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        log.warning("%s: cache entry %s is unreadable (%s), recomputing", desc, path.name, exc)
        return None
    if feats.shape != shape:
        log.warning("%s: cache entry %s has shape %s, recomputing", desc, path.name, feats.shape)
        return None
    return feats


def _save_atomic(path: Path, feats: np.ndarray) -> None:
    with atomic_open(path, "wb") as fh:
        np.save(fh, feats, allow_pickle=False)


@contextmanager
def all_cores() -> Iterator[None]:
    """Run torch on every core this process may use, then restore the thread count.

    Training may pin torch to one thread (its matrices are small), but the trunk forward over
    thousands of passages is GEMM-bound and scales with the cores.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(max(before, len(os.sched_getaffinity(0))))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _lookup(dirs: Sequence[Path], name: str, shape: tuple[int, int], desc: str) -> np.ndarray | None:
    for d in dirs:
        feats = _load(d / name, shape, desc)
        if feats is not None:
            return feats
    return None


def pooled_features(
    trunk: Trunk,
    texts: Sequence[str],
    cache_dir: str | Path | None = None,
    *,
    readonly: Sequence[str | Path] = (),
    fingerprint: str | None = None,
    batch_size: int = 64,
    desc: str = "trunk features",
) -> np.ndarray:
    """Pooled trunk features ``(n, H)`` float32 for ``texts``, from the cache when possible.

    The list is cached in consecutive chunks of :data:`CHUNK` texts, each under its own key,
    so an interrupted run resumes where it stopped and runs that share a text list (the same
    corpus in the same order) share its entries whatever else they embed. ``readonly`` folders
    are searched first (in order) and never written; computed chunks go to ``cache_dir``.
    """
    texts = list(texts)
    n, h = len(texts), trunk.hidden_size
    out = np.zeros((n, h), dtype=np.float32)
    cache = Path(cache_dir) if cache_dir is not None else None
    dirs = [Path(d) for d in readonly if Path(d).is_dir()] + ([cache] if cache is not None else [])
    fp = (fingerprint or trunk_fingerprint(trunk)) if dirs else ""
    todo: list[tuple[int, int, Path | None]] = []
    hits = 0
    for start in range(0, n, CHUNK):
        chunk = texts[start : start + CHUNK]
        name = chunk_name(fp, chunk) if dirs else ""
        feats = _lookup(dirs, name, (len(chunk), h), desc)
        path = cache / name if cache is not None else None
        if feats is None:
            todo.append((start, start + len(chunk), path))
        else:
            out[start : start + len(chunk)] = feats
            hits += len(chunk)
    if hits:
        log.info("%s: %d of %d texts from the cache", desc, hits, n)
    if todo:
        from tqdm.auto import tqdm

        total = sum(e - s for s, e, _ in todo)
        with all_cores(), tqdm(total=total, desc=desc, unit="text", mininterval=2.0) as bar:
            for start, end, path in todo:
                feats = trunk.encode(texts[start:end], batch_size=batch_size, progress=bar)
                out[start:end] = feats
                if path is not None:
                    _save_atomic(path, feats)
    return out


class FeatureStore:
    """Pooled trunk features by text (frozen mode): a lookup instead of a transformer pass."""

    def __init__(self, texts: list[str], feats: np.ndarray, device: torch.device) -> None:
        self.row = {t: i for i, t in enumerate(texts)}
        self.feats = torch.from_numpy(feats).to(device)

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return self.feats[[self.row[t] for t in texts]]
