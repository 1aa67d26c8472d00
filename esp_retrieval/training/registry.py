"""Build a method from a registry by key: the one place that says what an unknown name or bad
parameters look like (losses, weightings, surgeries, objective data; docs/architecture.md s. 6)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def build(kind: str, registry: Mapping[str, Callable[..., T]], name: str, *args: Any, **params: Any) -> T:
    """``registry[name](*args, **params)``; ``ValueError`` names the allowed keys or the bad
    parameters (a ``kind`` such as ``"loss"`` starts each message)."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; allowed: {sorted(registry)}")
    try:
        return registry[name](*args, **params)
    except TypeError as exc:
        raise ValueError(f"{kind} {name!r}: bad parameters {sorted(params)} ({exc})") from exc
