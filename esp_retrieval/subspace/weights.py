"""Resolve the weights a request gives into a dense vector the scorer can use.

Weights arrive as a dict by subspace name (partial dicts are completed from a default,
normally the operating point in use or the layout's defaults) or as a list in layout order.
They must be finite, ``>= 0``, not booleans, and not all zero; names must be layout names.
Every rejection is a :class:`WeightError` whose message names the field and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from esp_retrieval.subspace.errors import FieldError
from esp_retrieval.subspace.layout import SubspaceLayout

WeightsInput = Mapping[str, float] | Sequence[float]


class WeightError(FieldError):
    """Invalid request weights. ``field`` is the dotted path of the offending value."""

    def __init__(self, message: str, field: str | None = "weights") -> None:
        super().__init__(message, field)


def _check_value(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise WeightError(
            f"{field} must be a number >= 0, got {type(value).__name__} {value!r}", field
        )
    f = float(value)
    if not math.isfinite(f):
        raise WeightError(f"{field} must be finite (>= 0), got {value!r}", field)
    if f < 0:
        raise WeightError(f"{field} must be >= 0, got {value!r}", field)
    return f


def resolve_block_weights(
    weights: WeightsInput | None,
    layout: SubspaceLayout,
    default: WeightsInput | None = None,
    field: str = "weights",
) -> np.ndarray:
    """Return ``(K,)`` float64 weights in layout order.

    ``weights`` may be ``None`` (use ``default``), a partial dict (missing names take
    ``default``'s value), or a full list. ``default`` itself defaults to the layout's
    default weights and is validated the same way.
    """
    if default is None:
        base = layout.default_weights()
    else:
        base = resolve_block_weights(default, layout, None, field=f"{field}(default)")
    if weights is None:
        out = base.copy()
    elif isinstance(weights, Mapping):
        out = base.copy()
        for name, value in weights.items():
            if name not in layout:
                raise WeightError(
                    f"{field} has unknown subspace {name!r}; valid names: {list(layout.names)}",
                    f"{field}.{name}",
                )
            out[layout.index(name)] = _check_value(value, f"{field}.{name}")
    elif isinstance(weights, Sequence) and not isinstance(weights, str | bytes):
        if len(weights) != len(layout):
            raise WeightError(
                f"{field} as a list needs exactly {len(layout)} values, in layout order "
                f"{list(layout.names)}; got {len(weights)}",
                field,
            )
        out = np.array(
            [_check_value(v, f"{field}[{i}]") for i, v in enumerate(weights)], dtype=np.float64
        )
    else:
        raise WeightError(
            f"{field} must be an object by subspace name {list(layout.names)} or a list of "
            f"{len(layout)} numbers, got {type(weights).__name__}",
            field,
        )
    if not np.any(out > 0):
        raise WeightError(
            f"{field} are all zero: at least one of {list(layout.names)} must be > 0", field
        )
    return out


def resolve_weights(
    weights: WeightsInput | None,
    layout: SubspaceLayout,
    default: WeightsInput | None = None,
    field: str = "weights",
) -> np.ndarray:
    """Like :func:`resolve_block_weights` but expanded to a ``(D,)`` per-column vector."""
    return layout.expand(resolve_block_weights(weights, layout, default, field))


def weights_dict(block_weights: np.ndarray, layout: SubspaceLayout) -> dict[str, float]:
    """``(K,)`` weights back to ``{name: weight}`` (what a response reports as used)."""
    return {name: float(w) for name, w in zip(layout.names, block_weights, strict=True)}


def weight_layout(
    layout: SubspaceLayout, sparse_defaults: Mapping[str, float] | None = None
) -> SubspaceLayout:
    """The names a request's weights may carry, in order: ``layout``'s blocks, then each sparse
    block (docs/architecture.md s. 1) as a one-column entry with its default weight. Weights are
    resolved and validated against it; its first ``len(layout)`` entries are the dense blocks.
    ``layout`` itself when there is no sparse block."""
    if not sparse_defaults:
        return layout
    clash = sorted(set(sparse_defaults) & set(layout.names))
    if clash:
        raise WeightError(f"sparse blocks {clash} have the names of dense blocks", "sparse")
    dims = dict(zip(layout.names, layout.dims, strict=True))
    defaults = dict(zip(layout.names, layout.default_weights().tolist(), strict=True))
    losses = {o.name: o.loss for o in layout.objectives}
    return SubspaceLayout.from_dims(
        {**dims, **dict.fromkeys(sparse_defaults, 1)},
        losses={**losses, **dict.fromkeys(sparse_defaults, "bm25")},
        default_weights={**defaults, **{n: float(w) for n, w in sparse_defaults.items()}},
    )
