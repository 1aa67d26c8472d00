"""Dynamic Weight Average (Liu, Johns, Davison, "End-to-End Multi-Task Learning with Attention", 2019).

Losses are averaged over windows of ``window`` steps (an epoch in the paper). With
``Lbar_k(w)`` the mean **unweighted** loss of task k in window w, the weights used during
window w are::

    r_k(w)      = Lbar_k(w-1) / Lbar_k(w-2)
    lambda_k(w) = K * softmax_k(r_k(w) / T)          (sums to K)

and ``lambda_k = 1`` during the first two windows (no ratio exists yet). A task whose loss
falls more slowly gets more weight. Note: DWA looks at loss *ratios*,
so it does not correct a mismatch of loss scales.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from esp_retrieval.training.weighting.base import Weighting


class DWA(Weighting):
    name = "dwa"

    def __init__(self, tasks: Sequence[str], window: int = 20, temperature: float = 2.0) -> None:
        super().__init__(tasks)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"dwa: window must be an integer >= 1, got {window!r}")
        if not temperature > 0:
            raise ValueError(f"dwa: temperature must be > 0, got {temperature!r}")
        self.window = window
        self.temperature = float(temperature)
        self.history: list[np.ndarray] = []  # completed window means, (K,) each
        self._sum = np.zeros(self.k)
        self._n = 0
        self._current = np.ones(self.k)

    def weights(self) -> np.ndarray:
        return self._current.copy()

    def update(self, losses: Sequence[float]) -> None:
        super().update(losses)
        self._sum += np.asarray(losses, dtype=np.float64)
        self._n += 1
        if self._n == self.window:
            self.history.append(self._sum / self._n)
            self._sum = np.zeros(self.k)
            self._n = 0
            self._current = self._lambdas()

    def _lambdas(self) -> np.ndarray:
        if len(self.history) < 2:
            return np.ones(self.k)
        r = self.history[-1] / np.maximum(self.history[-2], 1e-12)
        z = r / self.temperature
        e = np.exp(z - z.max())
        return self.k * e / e.sum()

    def config(self) -> dict[str, Any]:
        return {"window": self.window, "temperature": self.temperature}
