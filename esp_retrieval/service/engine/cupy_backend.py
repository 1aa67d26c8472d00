"""``cupy``: the corpus resident on a CUDA device, exact weighted top k without leaving it.

The search is :class:`esp_retrieval.subspace.engine.array_scan.ArrayScanBackend` (the array code the CPU
suite runs under numpy) on cupy arrays, plus what is faster on a device:

- **float16** (the fast path): the corpus is stored in float16 on the device and the f-scaled
  queries are rounded to float16, so ``cupy.matmul`` runs cuBLAS ``gemmEx`` on the tensor cores
  (float32 accumulation, float16 scores); the completeness bound counts the query and score
  rounding (``2u``, and ``u`` more should cuBLAS reduce split-K partial sums in float16) and
  float16 subnormals. ``float32`` multiplies in float32 (the bound adds
  TF32's rounding if ``CUPY_TF32`` is set); ``bfloat16`` stores bit patterns and widens each
  chunk to float32 (cupy has no bfloat16 product), so it saves memory, not time.
- **selection**: ``torch.topk`` (a radix select) over DLPack views of the cupy arrays, no copy,
  when torch with CUDA is importable (the CUDA image has it for the query encoder);
  ``cupy.argpartition`` otherwise (it sorts). Either way only ``C / g + c g`` entries per
  chunk are selected among (the grouped selection of ``array_scan``).
- the float32 (or float16) master is copied to the device once for the exact float64 re-rank,
  shared with the scan copy when the scan is float32.

Without CUDA the backend does not start and says why (``cupy: not installed`` or ``cupy: CUDA
not available``), so ``auto`` and fallback chains log the reason and move on to a CPU backend.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from esp_retrieval.subspace.engine.array_scan import Array, ArrayScanBackend
from esp_retrieval.subspace.engine.base import PRECISIONS, BackendUnavailable, Capabilities

_TF32_UNIT = 2.0**-11  # TF32 keeps 10 mantissa bits, as float16 does


def cuda_unavailable_reason() -> str | None:
    """Why cupy cannot run here (``None`` when it can)."""
    try:
        import cupy
    except ImportError:
        return "cupy: not installed (pip install the 'gpu' extra)"
    except Exception as exc:  # a broken CUDA install can fail at import
        return f"cupy: cannot be imported ({exc})"
    try:
        if not cupy.cuda.is_available():
            return "cupy: CUDA not available"
    except Exception as exc:  # a broken driver raises instead of answering False
        return f"cupy: CUDA not available ({exc})"
    return None


def torch_topk(xp: ModuleType, torch: Any, x: Array, c: int) -> Array:
    """Indices ``(m, c)`` of the ``c`` largest entries per row, by ``torch.topk`` on a DLPack
    view of ``x`` (no copy; works for numpy arrays on the CPU as for cupy arrays on CUDA)."""
    picked = torch.topk(torch.from_dlpack(x), c, dim=1, largest=True, sorted=False).indices
    return xp.from_dlpack(picked)


class CupyBackend(ArrayScanBackend):
    name: ClassVar[str] = "cupy"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    # exact, the bundle's rows, read-only; no sparse blocks (a device scan cannot add them yet)
    capabilities: ClassVar[Capabilities] = Capabilities()
    workspace_bytes: ClassVar[int] = 1 << 30  # score buffer per scan step (device memory)
    rerank_elements: ClassVar[int] = 1 << 25  # float64 elements gathered at once (256 MiB)

    def _require(self) -> None:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(reason)

    def _array_module(self) -> ModuleType:
        import cupy

        return cupy

    def _load(self, corpus: np.ndarray) -> None:
        try:
            super()._load(corpus)
        except Exception as exc:
            if type(exc).__name__ != "OutOfMemoryError":  # cupy.cuda.memory.OutOfMemoryError
                raise
            raise BackendUnavailable(f"cupy: the corpus does not fit in device memory ({exc})") from exc
        self._torch = self._torch_for_selection()
        self.selection = "torch.topk" if self._torch is not None else "argpartition"

    def _torch_for_selection(self) -> Any:
        """torch when it can select on this device (CUDA), else ``None``."""
        try:
            import torch
        except ImportError:
            return None
        return torch if torch.cuda.is_available() else None

    def _to_host(self, x: Array) -> np.ndarray:
        return np.asarray(self.xp.asnumpy(x))

    def _topk(self, x: Array, c: int) -> Array:
        if self._torch is not None:
            return torch_topk(self.xp, self._torch, x, c)
        return super()._topk(x, c)

    def _stable_argsort(self, x: Array) -> Array:
        return x.argsort(axis=1)  # cupy's sort is stable

    def _lowp_products(self, nq: int) -> bool:
        return self.precision == "float16"

    def _scan_rel_error(self, nq: int) -> float:
        rel = super()._scan_rel_error(nq)
        if self.precision == "float16":
            # one more float16 rounding, should cuBLAS reduce split-K partial sums in the output type
            rel += PRECISIONS["float16"]
        elif int(os.environ.get("CUPY_TF32", "0") or 0) > 0:
            rel += 2.0 * _TF32_UNIT  # float32 products on TF32 tensor cores round both operands
        return rel

    def _score_bytes(self) -> int:
        return 2 if self.precision == "float16" else 4

    def _prepare(self, qscan: Array) -> Array:
        return qscan.astype(self.xp.float16) if self.precision == "float16" else qscan

    def _gemm(self, prepared: Array, start: int, stop: int) -> Array:
        if self.precision == "float16":  # float16 x float16 -> float16, float32 accumulation
            return self.xp.matmul(prepared, self._data[start:stop].T)
        return super()._gemm(prepared, start, stop)

    def close(self) -> None:
        """Drop the device arrays and return cupy's cached blocks to the driver."""
        self._data = self._master_dev = None
        try:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:  # closing never fails
            pass
