"""Gradient-surgery interface: per-task gradients of the shared parameters -> one gradient.

Input is ``(K, P)``: row k is the flattened gradient of ``lambda_k * L_k`` with respect to the
shared parameters (already weighted). Output is the combined ``(P,)`` gradient and a
:class:`SurgeryInfo` for the step log. Task-specific parameters (heads) never come here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SurgeryInfo:
    """``cosine[i, j]`` of raw task gradients; ``projected[i, j]``: g_i projected onto g_j's normal."""

    cosine: torch.Tensor  # (K, K)
    projected: torch.Tensor  # (K, K) bool


def pairwise_cosine(grads: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    norms = grads.norm(dim=1).clamp_min(eps)
    return (grads @ grads.T) / (norms[:, None] * norms[None, :])


class Surgery:
    name: str = ""

    def combine(self, grads: torch.Tensor) -> tuple[torch.Tensor, SurgeryInfo]:
        raise NotImplementedError  # pragma: no cover

    def config(self) -> dict[str, Any]:
        return {}
