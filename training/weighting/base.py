"""Weighting interface: owns its loss history and returns the task weights (lambdas) for a step.

Split from gradient surgery (see :mod:`training.surgery`) so the two combine freely:
the trainer asks :meth:`Weighting.weights` before the step, computes ``lambda_k * L_k``,
and reports the **unweighted** losses back with :meth:`Weighting.update` after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Weighting:
    name: str = ""

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

    def update(self, losses: Sequence[float]) -> None:
        """Record the step's unweighted losses ``(K,)``; default: stateless."""
        if len(losses) != self.k:
            raise ValueError(f"{self.name}: got {len(losses)} losses for {self.k} tasks")

    def config(self) -> dict[str, Any]:
        return {}
