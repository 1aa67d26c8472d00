"""Loss interface: a loss reads the fields of a :class:`TaskOutput` it needs and returns a scalar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class TaskOutput:
    """What one objective's forward pass produced for one mini-batch.

    Pair objectives fill ``anchors`` ``(B, d)``, ``positives`` ``(B, d)`` (row i pairs with
    anchor i), optionally ``negatives`` ``(M, d)`` (hard negatives, shared by the batch) and
    ``targets`` ``(B,)`` (graded or binary pair labels). Classification objectives fill
    ``logits`` ``(B, C)`` and ``labels`` ``(B,)`` (class indices). Vectors are L2-normalised.
    """

    anchors: torch.Tensor | None = None
    positives: torch.Tensor | None = None
    negatives: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    labels: torch.Tensor | None = None


class Loss(nn.Module):
    """Base class: hyperparameters are constructor kwargs; :meth:`config` serialises them."""

    name: str = ""

    def config(self) -> dict[str, Any]:
        return {}

    @staticmethod
    def need(out: TaskOutput, field: str, loss: str) -> torch.Tensor:
        value = getattr(out, field)
        if value is None:
            raise ValueError(f"loss {loss!r} needs the task output field {field!r}")
        return value

    def forward(self, out: TaskOutput) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
