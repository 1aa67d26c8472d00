"""InfoNCE with in-batch negatives (van den Oord et al. 2018; the MultipleNegativesRanking loss).

For anchors ``a`` ``(B, d)``, positives ``p`` ``(B, d)`` and optional hard negatives ``n``
``(M, d)`` shared by the batch, all L2-normalised::

    logits = [a p^T, a n^T] / temperature          (B, B + M)
    loss   = mean_i  -log softmax(logits_i)[i]

Every other positive in the batch is a negative for anchor i, so batches should not repeat
an anchor or a positive (the samplers in :mod:`esp_retrieval.training.data.batching` make sure of that).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from esp_retrieval.training.losses.base import Loss, TaskOutput


class InfoNCE(Loss):
    name = "info_nce"

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"info_nce: temperature must be > 0, got {temperature!r}")
        self.temperature = float(temperature)

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def forward(self, out: TaskOutput) -> torch.Tensor:
        a = self.need(out, "anchors", self.name)
        p = self.need(out, "positives", self.name)
        cands = p if out.negatives is None or len(out.negatives) == 0 else torch.cat([p, out.negatives])
        logits = a @ cands.T / self.temperature
        return F.cross_entropy(logits, torch.arange(len(a), device=a.device))
