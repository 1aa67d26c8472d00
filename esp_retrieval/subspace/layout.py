"""Subspace layouts: which contiguous block of the embedding belongs to which objective.

A layout splits a ``D``-dimensional vector into ``K`` contiguous blocks, one per objective
(Embedding Subspace Partitioning). Training writes it into the bundle manifest; the service
reads it back and validates every request against it, so it is the one place that knows
the subspace names, their sizes and their default weights.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from esp_retrieval.subspace.errors import FieldError

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class LayoutError(FieldError):
    """A layout that cannot be used; the message names the objective or field at fault."""


@dataclass(frozen=True)
class Objective:
    """One subspace: ``dim`` columns starting at ``offset``, trained with loss ``loss``."""

    name: str
    dim: int
    offset: int
    loss: str = "info_nce"
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise LayoutError(
                f"objective name {self.name!r} is invalid: use lower-case letters, digits and "
                "underscores, starting with a letter (at most 63 characters)"
            )
        for attr in ("dim", "offset"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int):
                raise LayoutError(f"objective {self.name!r}: {attr} must be an integer, got {value!r}")
        if self.dim <= 0:
            raise LayoutError(f"objective {self.name!r}: dim must be positive, got {self.dim}")
        if self.offset < 0:
            raise LayoutError(f"objective {self.name!r}: offset must be >= 0, got {self.offset}")
        if not isinstance(self.loss, str) or not self.loss:
            raise LayoutError(f"objective {self.name!r}: loss must be a non-empty string")
        w = self.default_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise LayoutError(
                f"objective {self.name!r}: default_weight must be a finite number >= 0, got {w!r}"
            )

    @property
    def end(self) -> int:
        return self.offset + self.dim

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dim": self.dim,
            "offset": self.offset,
            "loss": self.loss,
            "default_weight": float(self.default_weight),
        }


@dataclass(frozen=True)
class SubspaceLayout:
    """An ordered, gap-free partition of ``[0, dim)`` into named objectives.

    ``dim`` is the declared total; it must equal the sum of the blocks. Validation names the
    problem: duplicate names, gaps or overlaps between blocks, non-positive dims, a total that
    does not add up, or default weights that are all zero.
    """

    objectives: tuple[Objective, ...]
    dim: int = -1
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    # Built once: the service reads names/dims/offsets on every request.
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _dims: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _default_weights: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        objectives = tuple(self.objectives)
        object.__setattr__(self, "objectives", objectives)
        if not objectives:
            raise LayoutError("layout has no objectives: at least one is required")
        seen: dict[str, int] = {}
        for i, obj in enumerate(objectives):
            if not isinstance(obj, Objective):
                raise LayoutError(f"objectives[{i}] is not an Objective")
            if obj.name in seen:
                raise LayoutError(
                    f"duplicate objective name {obj.name!r} (positions {seen[obj.name]} and {i})"
                )
            seen[obj.name] = i
        expected = 0
        for obj in objectives:
            if obj.offset > expected:
                raise LayoutError(
                    f"gap before objective {obj.name!r}: columns {expected}..{obj.offset - 1} "
                    "belong to no objective"
                )
            if obj.offset < expected:
                raise LayoutError(
                    f"objective {obj.name!r} at offset {obj.offset} overlaps the previous block, "
                    f"which ends at {expected}"
                )
            expected = obj.end
        total = self.dim
        if total == -1:
            object.__setattr__(self, "dim", expected)
        elif isinstance(total, bool) or not isinstance(total, int) or total != expected:
            raise LayoutError(f"layout dim is {total!r} but the objectives' dims add up to {expected}")
        if all(obj.default_weight == 0 for obj in objectives):
            raise LayoutError("all default weights are zero: at least one must be > 0")
        object.__setattr__(self, "_index", seen)
        object.__setattr__(self, "_names", tuple(o.name for o in objectives))
        object.__setattr__(self, "_dims", tuple(o.dim for o in objectives))
        object.__setattr__(self, "_offsets", tuple(o.offset for o in objectives))
        object.__setattr__(self, "_default_weights", tuple(float(o.default_weight) for o in objectives))

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_dims(
        cls,
        dims: Mapping[str, int],
        *,
        losses: Mapping[str, str] | None = None,
        default_weights: Mapping[str, float] | None = None,
    ) -> SubspaceLayout:
        """Build a layout from ``{name: dim}`` in order, computing the offsets."""
        objectives, offset = [], 0
        for name, dim in dims.items():
            objectives.append(
                Objective(
                    name=name,
                    dim=dim,
                    offset=offset,
                    loss=(losses or {}).get(name, "info_nce"),
                    default_weight=(default_weights or {}).get(name, 1.0),
                )
            )
            offset += dim if isinstance(dim, int) else 0
        return cls(tuple(objectives))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubspaceLayout:
        """Inverse of :meth:`to_dict`; raises :class:`LayoutError` naming the bad field."""
        if not isinstance(data, Mapping):
            raise LayoutError("layout must be a JSON object with 'objectives' and 'dim'")
        raw = data.get("objectives")
        if not isinstance(raw, list):
            raise LayoutError("layout.objectives must be a list of objects")
        objectives = []
        allowed = {"name", "dim", "offset", "loss", "default_weight"}
        for i, item in enumerate(raw):
            if not isinstance(item, Mapping):
                raise LayoutError(f"layout.objectives[{i}] must be an object")
            unknown = set(item) - allowed
            if unknown:
                raise LayoutError(
                    f"layout.objectives[{i}] has unknown field(s) {sorted(unknown)}; "
                    f"allowed: {sorted(allowed)}"
                )
            missing = {"name", "dim", "offset"} - set(item)
            if missing:
                raise LayoutError(f"layout.objectives[{i}] lacks field(s) {sorted(missing)}")
            objectives.append(Objective(**item))
        return cls(tuple(objectives), dim=data.get("dim", -1))

    def to_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "objectives": [o.to_dict() for o in self.objectives]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> SubspaceLayout:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LayoutError(f"layout is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    # --- queries ------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def dims(self) -> tuple[int, ...]:
        return self._dims

    @property
    def offsets(self) -> tuple[int, ...]:
        return self._offsets

    def __len__(self) -> int:
        return len(self.objectives)

    def __iter__(self) -> Iterator[Objective]:
        return iter(self.objectives)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def index(self, name: str) -> int:
        """Position of objective ``name``; a :class:`KeyError` lists the valid names."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"unknown subspace {name!r}; valid: {list(self.names)}") from None

    def __getitem__(self, name: str) -> Objective:
        return self.objectives[self.index(name)]

    def slice(self, name: str) -> slice:
        obj = self[name]
        return slice(obj.offset, obj.end)

    def default_weights(self) -> np.ndarray:
        """``(K,)`` float64 default weights in layout order."""
        return np.array(self._default_weights, dtype=np.float64)

    def block_ids(self) -> np.ndarray:
        """``(D,)`` int: the objective index owning each column."""
        return np.repeat(np.arange(len(self.objectives)), self.dims)

    def indicator(self, dtype: Any = np.float32) -> np.ndarray:
        """``(D, K)`` 0/1 matrix; ``x**2 @ M`` gives per-block squared norms without a loop."""
        m = np.zeros((self.dim, len(self.objectives)), dtype=dtype)
        m[np.arange(self.dim), self.block_ids()] = 1
        return m

    def expand(self, block_weights: np.ndarray) -> np.ndarray:
        """Per-block values ``(..., K)`` repeated to per-column values ``(..., D)``."""
        return np.repeat(np.asarray(block_weights), self.dims, axis=-1)
