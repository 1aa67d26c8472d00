"""Loss registry: config names a loss by key and passes its hyperparameters as kwargs.

Adding a loss: one file with a :class:`~esp_retrieval.training.losses.base.Loss` subclass, one line in
:data:`LOSSES`, one test file.
"""

from __future__ import annotations

from typing import Any

from esp_retrieval.training.losses.base import Loss, TaskOutput
from esp_retrieval.training.losses.bce import BCE
from esp_retrieval.training.losses.cross_entropy import CrossEntropy
from esp_retrieval.training.losses.info_nce import InfoNCE
from esp_retrieval.training.losses.mse import MSE
from esp_retrieval.training.registry import build

LOSSES: dict[str, type[Loss]] = {
    "info_nce": InfoNCE,
    "cross_entropy": CrossEntropy,
    "mse": MSE,
    "bce": BCE,
}

__all__ = ["LOSSES", "Loss", "TaskOutput", "build_loss"]


def build_loss(name: str, **params: Any) -> Loss:
    """Instantiate loss ``name``; unknown names and bad kwargs raise ``ValueError`` naming them."""
    return build("loss", LOSSES, name, **params)
