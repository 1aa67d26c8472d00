"""Cross-entropy over class logits, with optional class weights against imbalance.

``loss = sum_i w_{y_i} * -log softmax(logits_i)[y_i] / sum_i w_{y_i}`` (PyTorch's weighted
mean). ``class_weights``: ``None`` (all 1), a list of C floats, or ``"balanced"`` — then the
trainer passes ``n / (C * count_c)`` from the training labels (scikit-learn's convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from esp_retrieval.training.losses.base import Loss, TaskOutput


class CrossEntropy(Loss):
    name = "cross_entropy"

    def __init__(self, class_weights: Sequence[float] | None = None, label_smoothing: float = 0.0) -> None:
        super().__init__()
        w = None if class_weights is None else torch.as_tensor(list(class_weights), dtype=torch.float32)
        if w is not None and (w.ndim != 1 or bool((w < 0).any()) or not bool(torch.isfinite(w).all())):
            raise ValueError(
                f"cross_entropy: class_weights must be finite numbers >= 0, got {class_weights!r}"
            )
        self.class_weights: torch.Tensor | None
        self.register_buffer("class_weights", w)
        self.label_smoothing = float(label_smoothing)

    def config(self) -> dict[str, Any]:
        w = self.class_weights
        return {
            "class_weights": None if w is None else [float(x) for x in w],
            "label_smoothing": self.label_smoothing,
        }

    def forward(self, out: TaskOutput) -> torch.Tensor:
        logits = self.need(out, "logits", self.name)
        labels = self.need(out, "labels", self.name)
        w = self.class_weights
        if w is not None and len(w) != logits.shape[-1]:
            raise ValueError(f"cross_entropy: {len(w)} class_weights for {logits.shape[-1]} classes")
        return F.cross_entropy(logits, labels, weight=w, label_smoothing=self.label_smoothing)
