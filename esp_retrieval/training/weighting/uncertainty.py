"""Uncertainty weighting (Kendall, Gal, Cipolla, "Multi-Task Learning Using Uncertainty to Weigh
Losses for Scene Geometry and Semantics", CVPR 2018).

Each task k learns a log-variance ``s_k = log sigma_k^2`` (``init``, default 0), trained by
the trainer's optimiser with the model. The step's total is::

    total    = sum_k  c_k exp(-s_k) L_k  +  s_k / 2
    lambda_k = c_k exp(-s_k)                          (the logged lambda)

with ``c_k = 1`` for a softmax / Bernoulli likelihood (the paper's classification form,
``L / sigma^2 + log sigma``): info_nce, cross_entropy and bce are negative log-likelihoods of
that kind, so this is the default; and ``c_k = 1/2`` for a Gaussian likelihood (the regression
form, ``L / (2 sigma^2) + log sigma``): name those tasks (an mse objective) in ``regression``.
For fixed losses the total is smallest at ``lambda_k = 1 / (2 L_k)``: a task with a larger loss
gets a smaller weight until every ``lambda_k L_k`` is 1/2, which balances loss scales (DWA,
which looks at loss ratios, does not). ``lr``: the log-variances' learning rate (default
``optim.lr``); they see no weight decay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from esp_retrieval.training.weighting.base import Weighting


class Uncertainty(Weighting):
    name = "uncertainty"

    def __init__(
        self, tasks: Sequence[str], regression: Sequence[str] = (), init: float = 0.0, lr: float | None = None
    ) -> None:
        super().__init__(tasks)
        unknown = sorted(set(regression) - set(self.tasks))
        if unknown:
            raise ValueError(f"uncertainty weighting: unknown task(s) {unknown}; valid: {self.tasks}")
        if isinstance(init, bool) or not isinstance(init, int | float) or not math.isfinite(init):
            raise ValueError(f"uncertainty weighting: init must be a finite number, got {init!r}")
        if lr is not None and not lr > 0:
            raise ValueError(f"uncertainty weighting: lr must be > 0, got {lr!r}")
        self.regression = [t for t in self.tasks if t in set(regression)]
        self.init, self.lr = float(init), lr
        self.log_vars = nn.Parameter(torch.full((self.k,), self.init))  # s_k, (K,)
        self._c = torch.tensor([0.5 if t in self.regression else 1.0 for t in self.tasks])

    def _lambdas(self) -> torch.Tensor:
        return self._c * torch.exp(-self.log_vars)

    def weights(self) -> np.ndarray:
        return self._lambdas().detach().double().numpy()

    def parameters(self) -> list[nn.Parameter]:
        return [self.log_vars]

    def combine(self, losses: torch.Tensor) -> torch.Tensor:
        return (self._lambdas() * losses).sum() + 0.5 * self.log_vars.sum()

    def config(self) -> dict[str, Any]:
        return {"regression": self.regression, "init": self.init, "lr": self.lr,
                "log_vars": self.log_vars.detach().tolist()}
