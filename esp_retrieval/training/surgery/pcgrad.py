"""PCGrad: projecting conflicting gradients (Yu et al., "Gradient Surgery for Multi-Task Learning", 2020).

For each task i, start from ``g_i`` and visit the other tasks j in a random order; whenever
``<g_i', g_j> < 0`` remove the conflicting component::

    g_i' <- g_i' - <g_i', g_j> / |g_j|^2 * g_j

(``g_j`` is the *original* gradient of task j, as in the paper's algorithm). The result is
``sum_i g_i'``. The order is drawn from a seeded generator when K > 2 (for K = 2 it does not
matter). Applied to the shared parameters only, on the weighted task gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from esp_retrieval.training.surgery.base import Surgery, SurgeryInfo, pairwise_cosine


def pcgrad(grads: torch.Tensor, orders: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Project ``grads`` ``(K, P)`` visiting tasks in ``orders[i]``; return ``(P,)`` and ``(K, K)`` flags."""
    k = grads.shape[0]
    projected = torch.zeros(k, k, dtype=torch.bool, device=grads.device)
    sq = (grads * grads).sum(1)
    out = torch.zeros_like(grads[0])
    for i in range(k):
        g = grads[i].clone()
        for j in orders[i]:
            if j == i:
                continue
            dot = torch.dot(g, grads[j])
            if dot < 0 and sq[j] > 0:
                g = g - dot / sq[j] * grads[j]
                projected[i, j] = True
        out += g
    return out, projected


class PCGrad(Surgery):
    name = "pcgrad"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def orders(self, k: int) -> list[list[int]]:
        """Per task, the other tasks in the order they are visited (random when K > 2)."""
        if k <= 2:
            return [[j for j in range(k) if j != i] for i in range(k)]
        return [[j for j in torch.randperm(k, generator=self._gen).tolist() if j != i] for i in range(k)]

    def combine(self, grads: torch.Tensor) -> tuple[torch.Tensor, SurgeryInfo]:
        combined, projected = pcgrad(grads, self.orders(grads.shape[0]))
        return combined, SurgeryInfo(pairwise_cosine(grads), projected)

    def config(self) -> dict[str, Any]:
        return {"seed": self.seed}
