"""``torch``: ``torch.mm`` over row chunks on the CPU, float32 or a float16/bfloat16 copy.

Low precision halves the bytes a scan reads. How to multiply them depends on the CPU: with
native bf16/fp16 matrix units (AVX-512 BF16/FP16, AMX) the product runs directly in low
precision; otherwise a matrix-vector product still runs well directly (F16C conversion in the
kernel), while a batched product is faster after widening each chunk to float32 in a small
per-worker buffer (torch's vectorised cast) and multiplying with numpy's BLAS, because torch's
float32 CPU matmul (MKL) is slow on AMD CPUs (``bench/knn.py`` compares them). Either way the
result is re-ranked exactly against the master (:mod:`esp_retrieval.subspace.engine.base`). CUDA is not used
here: the GPU path is the ``cupy`` backend.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from esp_retrieval.subspace.engine._gemv import rows_dot
from esp_retrieval.subspace.engine.base import BackendUnavailable, Capabilities
from esp_retrieval.subspace.engine.chunked import ChunkedBackend
from esp_retrieval.subspace.engine.numpy_backend import blas_limiter


class TorchBackend(ChunkedBackend):
    name: ClassVar[str] = "torch"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    capabilities: ClassVar[Capabilities] = Capabilities(sparse=True)  # exact, the bundle's rows, read-only
    # batches up to this size multiply low precision directly (memory-bound matrix-vector products)
    direct_max_batch: ClassVar[int] = 2

    def _require(self) -> None:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailable("torch: not installed (pip install the 'serve' extra)") from exc

    def _load(self, corpus: np.ndarray) -> None:
        import torch

        precision = self.precision
        self._torch = torch
        self._dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
            precision
        ]
        if precision == "float32" and corpus.dtype == np.float32:
            with warnings.catch_warnings():  # a read-only memmap: we never write through it
                warnings.simplefilter("ignore", UserWarning)
                self._data = torch.from_numpy(corpus)
        else:
            self._data = torch.empty(corpus.shape, dtype=self._dtype)
            for s in range(0, corpus.shape[0], 65536):
                block = torch.from_numpy(np.asarray(corpus[s : s + 65536]))
                self._data[s : s + 65536].copy_(block)
        cap = torch.backends.cpu.get_cpu_capability()
        self._native_lowp = "AVX512" in cap or "AMX" in cap
        self._local = threading.local()

    def _worker_limits(self) -> contextlib.AbstractContextManager[Any]:
        return blas_limiter(1)  # OpenBLAS's thread count is process-wide

    def _worker_initializer(self) -> Callable[[], None]:
        # per thread (OpenMP and MKL settings are thread-local); the torch function, not a bound
        # method, so the pool's threads do not keep the backend alive
        return functools.partial(self._torch.set_num_threads, 1)

    def _lowp_products(self, nq: int) -> bool:
        return self._dtype != self._torch.float32 and (self._native_lowp or nq <= self.direct_max_batch)

    def _prepare(self, scaled: np.ndarray, lowp_products: bool) -> tuple[Any, Any, bool]:
        q32 = self._torch.from_numpy(np.ascontiguousarray(scaled, dtype=np.float32))
        return q32, q32.to(self._dtype) if lowp_products else None, lowp_products

    def _chunk_scores(
        self, prepared: tuple[Any, Any, bool], start: int, stop: int, out: np.ndarray
    ) -> np.ndarray:
        torch = self._torch
        q32, qlow, direct = prepared
        target = torch.from_numpy(out)
        block = self._data[start:stop]
        if self._dtype == torch.float32:
            torch.mm(q32, block.T, out=target)
        elif direct:
            target.copy_(torch.mm(qlow, block.T))
        else:
            scratch = getattr(self._local, "scratch", None)
            if scratch is None or scratch.shape[0] < stop - start:
                scratch = self._local.scratch = torch.empty((stop - start, self.dim), dtype=torch.float32)
            widened = scratch[: stop - start]
            widened.copy_(block)
            rows, q = widened.numpy(), q32.numpy()
            if len(q) == 1:
                rows_dot(rows, q[0], out[0])
            else:
                np.matmul(q, rows.T, out=out)
        return out
