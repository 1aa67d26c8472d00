"""Task-weighting registry :data:`WEIGHTINGS`: one file per method, one line here (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from esp_retrieval.training.registry import build
from esp_retrieval.training.weighting.base import Weighting
from esp_retrieval.training.weighting.dwa import DWA
from esp_retrieval.training.weighting.equal import Equal
from esp_retrieval.training.weighting.static import Static
from esp_retrieval.training.weighting.uncertainty import Uncertainty

WEIGHTINGS: dict[str, type[Weighting]] = {
    "equal": Equal,
    "static": Static,
    "dwa": DWA,
    "uncertainty": Uncertainty,
}

__all__ = ["WEIGHTINGS", "Weighting", "build_weighting"]


def build_weighting(name: str, tasks: Sequence[str], **params: Any) -> Weighting:
    return build("weighting", WEIGHTINGS, name, tasks, **params)
