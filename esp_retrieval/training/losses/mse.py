"""Mean squared error between the pair cosine and a target (e.g. a graded label scaled to [0, 1]).

``loss = mean_i (<a_i, p_i> - t_i)^2`` for normalised ``a``, ``p`` ``(B, d)`` and targets ``t`` ``(B,)``.
"""

from __future__ import annotations

import torch

from esp_retrieval.training.losses.base import Loss, TaskOutput


class MSE(Loss):
    name = "mse"

    def forward(self, out: TaskOutput) -> torch.Tensor:
        a = self.need(out, "anchors", self.name)
        p = self.need(out, "positives", self.name)
        t = self.need(out, "targets", self.name).to(a.dtype)
        return ((a * p).sum(-1) - t).pow(2).mean()
