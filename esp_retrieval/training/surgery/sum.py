"""No surgery: the shared gradient is the plain sum of the (weighted) task gradients."""

from __future__ import annotations

import torch

from esp_retrieval.training.surgery.base import Surgery, SurgeryInfo, pairwise_cosine


class Sum(Surgery):
    name = "sum"

    def combine(self, grads: torch.Tensor) -> tuple[torch.Tensor, SurgeryInfo]:
        k = grads.shape[0]
        info = SurgeryInfo(pairwise_cosine(grads), torch.zeros(k, k, dtype=torch.bool, device=grads.device))
        return grads.sum(0), info
