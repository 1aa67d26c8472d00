"""Task-weighting registry :data:`WEIGHTINGS`: one file per method, one line here (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from training.registry import build
from training.weighting.base import Weighting
from training.weighting.dwa import DWA
from training.weighting.equal import Equal
from training.weighting.static import Static
from training.weighting.uncertainty import Uncertainty

WEIGHTINGS: dict[str, type[Weighting]] = {
    "equal": Equal,
    "static": Static,
    "dwa": DWA,
    "uncertainty": Uncertainty,
}

__all__ = ["WEIGHTINGS", "Weighting", "build_weighting"]


def build_weighting(name: str, tasks: Sequence[str], **params: Any) -> Weighting:
    return build("weighting", WEIGHTINGS, name, tasks, **params)
