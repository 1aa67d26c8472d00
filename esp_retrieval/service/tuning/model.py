"""Operating points and experiments: the parsed, validated registry and per-query weight resolution.

An **operating point** is a named weight per subspace (docs/architecture.md), with a description
and, when known, the offline metrics measured at those weights. An **experiment** splits
units (users, sessions) across **arms** by traffic share; each arm serves one operating
point, and a unit's arm is a pure function of ``(salt, unit id)`` (see :mod:`.assignment`).

Operating points come from two places, merged by name:

1. the bundle manifest's ``operating_points`` section (written by training, with metrics);
2. the registry file (a ConfigMap in Kubernetes), which **wins**: a registry point with the
   same name replaces the bundle's. It keeps the bundle's metrics only when its weights are
   identical (metrics measured at other weights would be a lie) and the bundle's description
   when it gives none.

The file's rules live in :mod:`.schema` (strict pydantic models). Every problem with the file
or a query's weight source is a :class:`RegistryError` naming the dotted field and what is
allowed; a named point that does not fit the layout of a bundle being swapped in is a
``NotReadyError`` until the watcher has re-validated the registry.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.service.tuning.assignment import bucket, pick, traffic_bucket
from esp_retrieval.service.tuning.errors import RegistryError
from esp_retrieval.service.tuning.loader import load_document
from esp_retrieval.service.tuning.schema import PointSpec, validate_bundle_points, validate_file
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.weights import WeightError, resolve_block_weights, weights_dict

__all__ = ["Arm", "Assignment", "Experiment", "OperatingPoint", "Registry", "RegistryError", "Resolved"]

_FIXED_CACHE_MAX = 256  # (source, layout) entries per registry; the layouts of a few bundle swaps


@dataclass(frozen=True)
class OperatingPoint:
    """A named weight per subspace. ``weights`` is complete: every layout name, layout order."""

    name: str
    weights: dict[str, float]
    description: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    source: str = "registry"  # "registry" (the file) or "bundle" (the manifest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weights": dict(self.weights),
            "description": self.description,
            "metrics": dict(self.metrics),
            "source": self.source,
        }


@dataclass(frozen=True)
class Arm:
    """One arm of an experiment: a traffic share served with one operating point."""

    name: str
    share: float
    operating_point: str


class Assignment(NamedTuple):
    """Where one unit lands. ``included`` is false for units outside the experiment's traffic
    (or all units of a disabled experiment): they get the default arm and are not exposures."""

    experiment: str
    arm: Arm
    included: bool


@dataclass(frozen=True)
class Experiment:
    """Arms in configuration order (the order fixes the bucket intervals).

    ``traffic`` is the fraction of units in the experiment and ``enabled`` switches it off
    without deleting it; units outside get ``default_arm``, which is required whenever
    ``traffic < 1`` or the experiment is disabled.
    """

    name: str
    salt: str
    arms: tuple[Arm, ...]
    default_arm: str | None = None
    traffic: float = 1.0
    enabled: bool = True
    description: str = ""

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"experiment {self.name!r} has no arm {name!r}")

    @property
    def salt_fingerprint(self) -> str:
        """First 12 hex digits of sha256(salt): shows a reshuffle without publishing the salt."""
        return hashlib.sha256(self.salt.encode()).hexdigest()[:12]

    def assign(self, unit_id: str) -> Assignment:
        excluded = not self.enabled or (
            self.traffic < 1.0 and traffic_bucket(self.salt, unit_id) >= self.traffic
        )
        if excluded:
            assert self.default_arm is not None  # validated: exclusion needs a default arm
            return Assignment(self.name, self.arm(self.default_arm), included=False)
        u = bucket(self.salt, unit_id)
        return Assignment(self.name, self.arms[pick([a.share for a in self.arms], u)], True)

    def to_dict(self) -> dict[str, Any]:
        """The public view: no salt, only its fingerprint."""
        return {
            "name": self.name,
            "description": self.description,
            "enabled": self.enabled,
            "traffic": self.traffic,
            "default_arm": self.default_arm,
            "salt_fingerprint": self.salt_fingerprint,
            "arms": [
                {"name": a.name, "share": a.share, "operating_point": a.operating_point}
                for a in self.arms
            ],
        }


class Resolved(NamedTuple):
    """The weights one query is scored with, and where they came from (for the response)."""

    block_weights: np.ndarray  # (K,) float64, layout order
    weights_used: dict[str, float]
    operating_point: str | None
    experiment: str | None
    arm: str | None
    excluded: bool = False  # unit outside the experiment's traffic: served default_arm, not an exposure


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _point(name: str, spec: PointSpec, layout: SubspaceLayout, source: str) -> OperatingPoint:
    """A validated point with complete weights: every layout name, layout order."""
    block = resolve_block_weights(dict(spec.weights), layout)  # validated: names known, not all zero
    return OperatingPoint(name, weights_dict(block, layout), spec.description, spec.metrics or {}, source)


def _merge(bundle: Mapping[str, OperatingPoint], registry: Mapping[str, OperatingPoint]
           ) -> dict[str, OperatingPoint]:
    merged = dict(bundle)
    for name, point in registry.items():
        old = bundle.get(name)
        if old is None:
            merged[name] = point
            continue
        metrics = point.metrics or (old.metrics if old.weights == point.weights else {})
        merged[name] = OperatingPoint(
            name, point.weights, point.description or old.description, metrics, point.source
        )
    return merged


# --- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Registry:
    """An immutable, validated registry; the watcher swaps whole instances, never mutates one.

    ``layout`` is the layout it was validated against (``None`` only for :meth:`empty`).
    """

    operating_points: Mapping[str, OperatingPoint] = field(default_factory=lambda: MappingProxyType({}))
    experiments: Mapping[str, Experiment] = field(default_factory=lambda: MappingProxyType({}))
    default_operating_point: str | None = None
    layout: SubspaceLayout | None = None
    source: str | None = None
    # Weights of the fixed sources (a named point, or the layout's defaults) per layout served,
    # built on first use: rebuilding them on every search cost ~5% of the event loop's time.
    _fixed: dict[tuple[str | None, int], tuple[SubspaceLayout, np.ndarray, dict[str, float]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def empty(cls, layout: SubspaceLayout | None = None) -> Registry:
        """No operating points or experiments: queries use explicit weights or layout defaults."""
        return cls(layout=layout)

    @classmethod
    def parse(
        cls,
        data: Any,
        layout: SubspaceLayout,
        bundle_points: Mapping[str, Any] | None = None,
        *,
        source: str = "registry",
    ) -> Registry:
        """Validate a registry document (the parsed YAML/JSON) against ``layout``.

        ``bundle_points`` is the manifest's ``operating_points`` section; the registry's
        points override them by name. ``data=None`` means "no file": bundle points only.
        """
        bundle = {name: _point(name, spec, layout, "bundle")
                  for name, spec in validate_bundle_points(bundle_points or {}, layout).items()}
        if data is None:
            return cls(MappingProxyType(bundle), layout=layout, source="bundle")
        doc = validate_file(data, layout, bundle, source)
        points = _merge(bundle, {name: _point(name, spec, layout, "registry")
                                 for name, spec in doc.operating_points.items()})
        experiments = {
            name: Experiment(name, e.salt, tuple(Arm(a.name, a.share, a.operating_point) for a in e.arms),
                             e.default_arm, e.traffic, e.enabled, e.description)
            for name, e in doc.experiments.items()
        }
        return cls(MappingProxyType(points), MappingProxyType(experiments), doc.default_operating_point,
                   layout, source)

    @classmethod
    def load(cls, path: str | os.PathLike[str], layout: SubspaceLayout,
             bundle_points: Mapping[str, Any] | None = None) -> Registry:
        """Read and validate a YAML or JSON registry file (see :mod:`.loader`)."""
        return cls.parse(load_document(path), layout, bundle_points, source=str(path))

    # --- queries ----------------------------------------------------------------------------
    def known_labels(self) -> list[tuple[str, str]]:
        """Every ``(experiment, arm)`` pair: the only label values the experiment counter may take."""
        return [(e.name, a.name) for e in self.experiments.values() for a in e.arms]

    def experiment(self, name: str, field: str = "experiment") -> Experiment:
        try:
            return self.experiments[name]
        except KeyError:
            raise RegistryError(f"unknown experiment {name!r}; defined: {sorted(self.experiments)}",
                                field) from None

    def operating_point(self, name: str, field: str = "operating_point") -> OperatingPoint:
        try:
            return self.operating_points[name]
        except KeyError:
            raise RegistryError(
                f"unknown operating point {name!r}; defined: {sorted(self.operating_points)}", field
            ) from None

    def assignment(self, experiment: str, unit_id: str, field: str = "") -> Assignment:
        """The arm of ``unit_id`` in ``experiment`` and whether the unit is inside its traffic."""
        exp = self.experiment(experiment, _join(field, "experiment"))
        if not isinstance(unit_id, str) or not unit_id:
            raise RegistryError(
                f"unit_id must be a non-empty string to assign an arm of experiment {experiment!r}",
                _join(field, "unit_id"),
            )
        return exp.assign(unit_id)

    def assign(self, experiment: str, unit_id: str) -> Arm:
        """Deterministic arm: a function of (salt, unit id) only; see :mod:`.assignment`."""
        return self.assignment(experiment, unit_id).arm

    def resolve(
        self,
        layout: SubspaceLayout,
        *,
        weights: Any = None,
        operating_point: str | None = None,
        experiment: str | None = None,
        unit_id: str | None = None,
        field: str = "",
    ) -> Resolved:
        """The ``(K,)`` weights for one query from at most one source.

        Sources: explicit ``weights`` (a dict by name, completed from the default operating
        point or else the layout's defaults; or a full list), a named ``operating_point``, or
        ``experiment`` + ``unit_id`` (the arm's operating point). None of them: the registry's
        ``default_operating_point`` if it names one, else the layout's defaults. ``field`` is
        the request path of this query (e.g. ``queries[3]``) for error messages.
        """
        given = [name for name, value in (("weights", weights), ("operating_point", operating_point),
                                           ("experiment", experiment)) if value is not None]
        if len(given) > 1:
            raise RegistryError(
                f"one source of weights per query: got {' and '.join(given)}; give weights, "
                "operating_point, or experiment with unit_id",
                _join(field, given[1]),
            )
        if unit_id is not None and experiment is None:
            raise RegistryError("unit_id is only used together with experiment", _join(field, "unit_id"))
        if experiment is not None:
            if unit_id is None:
                raise RegistryError(
                    f"experiment {experiment!r} needs a unit_id (the id arms are assigned by)",
                    _join(field, "unit_id"),
                )
            a = self.assignment(experiment, unit_id, field)
            point = self.operating_points[a.arm.operating_point]
            block, used = self._fixed_weights(point, layout, field)
            return Resolved(block, used, point.name, experiment, a.arm.name, excluded=not a.included)
        if operating_point is not None:
            point = self.operating_point(operating_point, _join(field, "operating_point"))
            block, used = self._fixed_weights(point, layout, field)
            return Resolved(block, used, point.name, None, None)
        default = (self.operating_points[self.default_operating_point]
                   if self.default_operating_point is not None else None)
        if weights is None:
            block, used = self._fixed_weights(default, layout, field)
            return Resolved(block, used, None if default is None else default.name, None, None)
        try:
            block = resolve_block_weights(
                weights, layout, None if default is None else default.weights, field=_join(field, "weights")
            )
        except WeightError as exc:
            raise RegistryError(str(exc), exc.field) from None
        return Resolved(block, weights_dict(block, layout), None, None, None)

    def _fixed_weights(
        self, point: OperatingPoint | None, layout: SubspaceLayout, field: str
    ) -> tuple[np.ndarray, dict[str, float]]:
        """``(block weights, weights by name)`` of ``point`` (None: the layout's defaults) for
        ``layout``, computed once per layout. The array is read-only (shared by every request);
        the dict is a fresh copy (it goes into a response)."""
        key = (None if point is None else point.name, id(layout))
        hit = self._fixed.get(key)
        if hit is None or hit[0] is not layout:  # `is`: an id can be reused by a later layout
            if point is not None:
                block = self._point_weights(point, layout)
            else:
                try:
                    block = resolve_block_weights(None, layout, field=_join(field, "weights"))
                except WeightError as exc:
                    raise RegistryError(str(exc), exc.field) from None
            block.setflags(write=False)
            if len(self._fixed) >= _FIXED_CACHE_MAX:
                self._fixed.clear()
            hit = self._fixed[key] = (layout, block, weights_dict(block, layout))
        return hit[1], dict(hit[2])

    def _point_weights(self, point: OperatingPoint, layout: SubspaceLayout) -> np.ndarray:
        # The registry was validated against self.layout; during a bundle swap the caller's
        # layout may briefly differ until the watcher re-validates against the new bundle.
        if self.layout is not None and layout == self.layout:
            return np.array([point.weights[n] for n in layout.names], dtype=np.float64)
        try:
            return resolve_block_weights(point.weights, layout, field=f"operating_points.{point.name}")
        except WeightError as exc:
            raise NotReadyError(  # -> 503: the watcher re-validates the registry for the new bundle
                f"operating point {point.name!r} does not fit the served layout ({exc}); "
                "the registry is being re-validated against the new bundle"
            ) from None
