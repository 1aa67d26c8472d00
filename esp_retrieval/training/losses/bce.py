"""Binary cross-entropy on scaled pair cosines (relevant / not relevant pairs).

``z_i = <a_i, p_i> / temperature``; ``loss = mean_i BCEWithLogits(z_i, t_i)`` with ``t_i`` in [0, 1].
When the task output has ``logits`` ``(B, C)`` and multi-hot ``targets`` ``(B, C)`` instead
(multi-label classification), those are used directly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from esp_retrieval.training.losses.base import Loss, TaskOutput


class BCE(Loss):
    name = "bce"

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"bce: temperature must be > 0, got {temperature!r}")
        self.temperature = float(temperature)

    def config(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def forward(self, out: TaskOutput) -> torch.Tensor:
        t = self.need(out, "targets", self.name)
        if out.logits is not None:
            z = out.logits
        else:
            a = self.need(out, "anchors", self.name)
            p = self.need(out, "positives", self.name)
            z = (a * p).sum(-1) / self.temperature
        return F.binary_cross_entropy_with_logits(z, t.to(z.dtype))
