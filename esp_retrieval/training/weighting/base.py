"""Weighting interface: owns its state and returns the task weights (lambdas) for a step.

Split from gradient surgery (see :mod:`esp_retrieval.training.surgery`) so the two combine freely. Per step
the trainer (docs/architecture.md, "Training"):

1. asks :meth:`Weighting.weights` for the lambdas ``(K,)`` (logged per task);
2. forms each task's gradient ``grad(lambda_k * L_k)`` (surgery combines the shared parts);
3. shows the per-task shared gradient norms to :meth:`Weighting.observe_gradients`;
4. if the method has learnable :meth:`Weighting.parameters`, back-propagates
   :meth:`Weighting.combine` of the detached losses into them; the trainer's optimiser
   steps them with the model;
5. reports the **unweighted** losses with :meth:`Weighting.update`.

Loss-history methods (equal, static, DWA) implement ``weights`` and perhaps ``update``;
learned ones (uncertainty weighting) add ``parameters`` and ``combine``; gradient-aware ones
(GradNorm) read the norms in ``observe_gradients`` and put their own objective in ``combine``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn


class Weighting:
    name: str = ""
    #: learning rate of :meth:`parameters`; ``None``: the optimiser's ``optim.lr``
    lr: float | None = None

    def __init__(self, tasks: Sequence[str]) -> None:
        if not tasks:
            raise ValueError("weighting needs at least one task")
        self.tasks = list(tasks)

    @property
    def k(self) -> int:
        return len(self.tasks)

    def weights(self) -> np.ndarray:
        """``(K,)`` float64 lambdas for the coming step, in task order."""
        raise NotImplementedError  # pragma: no cover

    def parameters(self) -> list[nn.Parameter]:
        """Learnable parameters the trainer's optimiser includes (own group, no weight decay,
        not clipped); default none."""
        return []

    def combine(self, losses: torch.Tensor) -> torch.Tensor:
        """The scalar whose gradient trains :meth:`parameters`, from the step's detached
        task losses ``(K,)`` (float32, CPU).

        For a loss-based method it is the weighted total with any regulariser, a differentiable
        function of the parameters whose derivative in ``L_k`` is ``weights()[k]`` (the
        trainer forms the model's gradients per task from ``weights()``, so surgery sees them).
        Called only when :meth:`parameters` is not empty; default: ``sum_k lambda_k L_k``.
        """
        return (torch.as_tensor(self.weights(), dtype=losses.dtype) * losses).sum()

    def observe_gradients(self, norms: np.ndarray) -> None:
        """Optional hook: ``(K,)`` norms of each task's weighted shared gradient
        ``|grad_shared(lambda_k L_k)|`` (before surgery), after the task gradients and before
        :meth:`combine`; default: ignored."""

    def update(self, losses: Sequence[float]) -> None:
        """Record the step's unweighted losses ``(K,)`` after the optimiser step; default: stateless."""
        if len(losses) != self.k:
            raise ValueError(f"{self.name}: got {len(losses)} losses for {self.k} tasks")

    def config(self) -> dict[str, Any]:
        return {}
