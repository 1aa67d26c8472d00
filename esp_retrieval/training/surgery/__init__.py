"""Gradient-surgery registry :data:`SURGERIES`: one file per method, one line here (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from esp_retrieval.training.registry import build
from esp_retrieval.training.surgery.base import Surgery, SurgeryInfo
from esp_retrieval.training.surgery.pcgrad import PCGrad
from esp_retrieval.training.surgery.sum import Sum

SURGERIES: dict[str, type[Surgery]] = {
    "sum": Sum,
    "pcgrad": PCGrad,
}

__all__ = ["SURGERIES", "Surgery", "SurgeryInfo", "build_surgery"]


def build_surgery(name: str, **params: Any) -> Surgery:
    return build("surgery", SURGERIES, name, **params)
