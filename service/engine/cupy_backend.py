"""``cupy``: the GPU backend's slot (fp16/bf16 matrix product + top-k on the device).

Not implemented yet: the GPU issue fills it. Until then it never starts, and says why, so that
``auto`` and explicit fallback chains log the reason and move on to a CPU backend.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from subspace.engine.base import Backend, BackendUnavailable


def cuda_unavailable_reason() -> str | None:
    """Why cupy cannot run here (``None`` when it can)."""
    try:
        import cupy
    except ImportError:
        return "cupy: not installed (pip install the 'gpu' extra)"
    try:
        if not cupy.cuda.is_available():
            return "cupy: CUDA not available"
    except Exception as exc:  # a broken driver raises instead of answering False
        return f"cupy: CUDA not available ({exc})"
    return None


class CupyBackend(Backend):
    name: ClassVar[str] = "cupy"
    precisions: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")

    def _require(self) -> None:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(reason)
        raise BackendUnavailable("cupy: the GPU backend is not implemented yet (a slot for the GPU issue)")

    def _scan(self, scaled: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        raise NotImplementedError
