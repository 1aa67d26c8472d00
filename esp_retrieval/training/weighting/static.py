"""Static weighting: fixed ``lambda_k`` per task from the config (e.g. the single-head alpha).

``weights: {task: lambda}``; tasks not named keep 1.0; unknown names or negative / non-finite
values are rejected with the valid task names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from esp_retrieval.training.weighting.base import Weighting


class Static(Weighting):
    name = "static"

    def __init__(self, tasks: Sequence[str], weights: Mapping[str, float] | None = None) -> None:
        super().__init__(tasks)
        weights = dict(weights or {})
        unknown = sorted(set(weights) - set(self.tasks))
        if unknown:
            raise ValueError(f"static weighting: unknown task(s) {unknown}; valid: {self.tasks}")
        for name, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
                raise ValueError(
                    f"static weighting: weight of {name!r} must be a finite number >= 0, got {w!r}"
                )
        self._w = np.array([float(weights.get(t, 1.0)) for t in self.tasks])
        if not (self._w > 0).any():
            raise ValueError("static weighting: at least one weight must be > 0")

    def weights(self) -> np.ndarray:
        return self._w.copy()

    def config(self) -> dict[str, Any]:
        return {"weights": dict(zip(self.tasks, self._w.tolist(), strict=True))}
