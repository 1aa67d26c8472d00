"""Equal weighting: ``lambda_k = 1`` for every task (the plain loss sum)."""

from __future__ import annotations

import numpy as np

from esp_retrieval.training.weighting.base import Weighting


class Equal(Weighting):
    name = "equal"

    def weights(self) -> np.ndarray:
        return np.ones(self.k)
