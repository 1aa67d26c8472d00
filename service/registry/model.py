"""Operating points and experiments: the parsed, validated registry and per-query weight resolution.

An **operating point** is a named weight per subspace (DESIGN section 5), with a description
and, when known, the offline metrics measured at those weights. An **experiment** splits
units (users, sessions) across **arms** by traffic share; each arm serves one operating
point, and a unit's arm is a pure function of ``(salt, unit id)`` (see :mod:`.assignment`).

Operating points come from two places, merged by name:

1. the bundle manifest's ``operating_points`` section (written by training, with metrics);
2. the registry file (a ConfigMap in Kubernetes), which **wins**: a registry point with the
   same name replaces the bundle's. It keeps the bundle's metrics only when its weights are
   identical (metrics measured at other weights would be a lie) and the bundle's description
   when it gives none.

Every problem is a :class:`RegistryError` whose message names the file, the dotted field and
what is allowed; unknown keys are errors, so a typo never passes silently.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from service.errors import ErrorKind, ServiceError
from service.registry import assignment
from subspace.errors import FieldError
from subspace.layout import SubspaceLayout
from subspace.weights import WeightError, resolve_block_weights, weights_dict

#: Names become metric label values and URL path segments: keep them short and plain.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SHARE_TOLERANCE = 1e-9
_FIXED_CACHE_MAX = 256  # (source, layout) entries per registry; the layouts of a few bundle swaps
FORMAT_VERSION = 1

_TOP_KEYS = frozenset({"version", "default_operating_point", "operating_points", "experiments"})
_POINT_KEYS = frozenset({"weights", "description", "metrics"})
_EXPERIMENT_KEYS = frozenset({"salt", "arms", "default_arm", "traffic", "enabled", "description"})
_ARM_KEYS = frozenset({"name", "share", "operating_point"})


class RegistryError(FieldError):
    """An invalid registry (or bundle operating points). ``field`` is the dotted path at fault."""


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
            self.traffic < 1.0 and assignment.traffic_bucket(self.salt, unit_id) >= self.traffic
        )
        if excluded:
            assert self.default_arm is not None  # validated: exclusion needs a default arm
            return Assignment(self.name, self.arm(self.default_arm), included=False)
        u = assignment.bucket(self.salt, unit_id)
        return Assignment(self.name, self.arms[assignment.pick([a.share for a in self.arms], u)], True)

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


# --- validation helpers -----------------------------------------------------------------------


def _join(prefix: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else key


class _Checker:
    """Raises :class:`RegistryError` prefixed with the source (file name) and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> RegistryError:
        return RegistryError(f"{self.source}: {where}: {problem}" if where else f"{self.source}: {problem}",
                             where or None)

    def mapping(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"must be a mapping, got {_kind(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(where, f"keys must be strings, got {_kind(key)} {key!r}")
        return value

    def keys(self, value: Mapping[str, Any], allowed: frozenset[str], where: str,
             required: frozenset[str] = frozenset()) -> None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        missing = sorted(required - set(value))
        if missing:
            raise self.fail(where, f"missing required key(s) {missing}")

    def name(self, value: Any, where: str, what: str) -> str:
        if not isinstance(value, str) or not NAME_RE.fullmatch(value):
            raise self.fail(
                where,
                f"{what} {value!r} is invalid: use 1-64 letters, digits, '_', '-' or '.', "
                "starting with a letter or digit",
            )
        return value

    def string(self, value: Any, where: str, *, empty_ok: bool = True) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, got {_kind(value)} {value!r}")
        if not empty_ok and not value:
            raise self.fail(where, "must be a non-empty string")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            hint = ""
            if isinstance(value, str) and _looks_numeric(value):
                hint = " (YAML 1.1 reads 1e-3 as a string: write 1.0e-3)"
            raise self.fail(where, f"must be a number, got {_kind(value)} {value!r}{hint}")
        f = float(value)
        if not math.isfinite(f):
            raise self.fail(where, f"must be finite, got {value!r}")
        return f

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"must be true or false, got {_kind(value)} {value!r}")
        return value

    def json_value(self, value: Any, where: str) -> Any:
        """Metrics are reported as JSON: plain scalars, lists and string-keyed mappings only."""
        if value is None or isinstance(value, bool | str | int):
            return value
        if isinstance(value, float):
            return self.number(value, where)
        if isinstance(value, list | tuple):
            return [self.json_value(v, _join(where, i)) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {k: self.json_value(v, _join(where, k)) for k, v in self.mapping(value, where).items()}
        raise self.fail(where, f"must be a JSON value, got {_kind(value)}")


def _kind(value: Any) -> str:
    return {bool: "boolean", str: "string", int: "integer", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _parse_point(
    name: str, raw: Any, layout: SubspaceLayout, check: _Checker, where: str, *, source: str, strict: bool
) -> OperatingPoint:
    check.name(name, where, "operating point name")
    body = check.mapping(raw, where)
    if strict:
        check.keys(body, _POINT_KEYS, where, required=frozenset({"weights"}))
    elif "weights" not in body:
        raise check.fail(where, "missing required key(s) ['weights']")
    wfield = _join(where, "weights")
    weights = check.mapping(body["weights"], wfield)
    for key, value in weights.items():
        if key not in layout:
            raise check.fail(
                _join(wfield, key), f"unknown subspace {key!r}; valid names: {list(layout.names)}"
            )
        if check.number(value, _join(wfield, key)) < 0:
            raise check.fail(_join(wfield, key), f"must be >= 0, got {value!r}")
    try:
        block = resolve_block_weights(dict(weights), layout, field=wfield)
    except WeightError as exc:  # all zero after completing from the layout defaults
        raise check.fail(exc.field or wfield, str(exc)) from None
    description = check.string(body.get("description", ""), _join(where, "description"))
    metrics = body.get("metrics") or {}
    metrics = check.json_value(check.mapping(metrics, _join(where, "metrics")), _join(where, "metrics"))
    return OperatingPoint(name, weights_dict(block, layout), description, metrics, source)


def _parse_experiment(
    name: str, raw: Any, points: Mapping[str, OperatingPoint], check: _Checker, where: str
) -> Experiment:
    check.name(name, where, "experiment name")
    body = check.mapping(raw, where)
    check.keys(body, _EXPERIMENT_KEYS, where, required=frozenset({"salt", "arms"}))
    salt = check.string(body["salt"], _join(where, "salt"), empty_ok=False)
    arms_field = _join(where, "arms")
    raw_arms = body["arms"]
    if not isinstance(raw_arms, list) or not raw_arms:
        raise check.fail(arms_field, f"must be a non-empty list of arms, got {_kind(raw_arms)}")
    arms: list[Arm] = []
    seen: set[str] = set()
    for i, raw_arm in enumerate(raw_arms):
        afield = _join(arms_field, i)
        arm = check.mapping(raw_arm, afield)
        check.keys(arm, _ARM_KEYS, afield, required=_ARM_KEYS)
        arm_name = check.name(arm["name"], _join(afield, "name"), "arm name")
        if arm_name in seen:
            raise check.fail(_join(afield, "name"), f"duplicate arm name {arm_name!r}")
        seen.add(arm_name)
        share = check.number(arm["share"], _join(afield, "share"))
        if share <= 0:
            raise check.fail(_join(afield, "share"), f"must be > 0, got {arm['share']!r}")
        point = check.string(arm["operating_point"], _join(afield, "operating_point"))
        if point not in points:
            raise check.fail(
                _join(afield, "operating_point"),
                f"unknown operating point {point!r}; defined: {sorted(points)}",
            )
        arms.append(Arm(arm_name, share, point))
    total = math.fsum(a.share for a in arms)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise check.fail(
            arms_field, f"shares must sum to 1 (within {SHARE_TOLERANCE:g}), they sum to {total!r}"
        )
    traffic = check.number(body.get("traffic", 1.0), _join(where, "traffic"))
    if not 0.0 <= traffic <= 1.0:
        raise check.fail(_join(where, "traffic"), f"must be in [0, 1], got {traffic!r}")
    enabled = check.boolean(body.get("enabled", True), _join(where, "enabled"))
    default_arm = body.get("default_arm")
    if default_arm is not None:
        check.string(default_arm, _join(where, "default_arm"))
        if default_arm not in seen:
            raise check.fail(
                _join(where, "default_arm"),
                f"{default_arm!r} is not one of the arms {[a.name for a in arms]}",
            )
    elif traffic < 1.0 or not enabled:
        raise check.fail(
            _join(where, "default_arm"),
            "required when traffic < 1 or enabled is false: excluded units need an arm to be served",
        )
    description = check.string(body.get("description", ""), _join(where, "description"))
    return Experiment(name, salt, tuple(arms), default_arm, traffic, enabled, description)


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
        bundle = cls._parse_bundle_points(bundle_points, layout)
        if data is None:
            return cls(MappingProxyType(bundle), layout=layout, source="bundle")
        check = _Checker(source)
        top = check.mapping(data, "")
        check.keys(top, _TOP_KEYS, "")
        if "version" in top and (isinstance(top["version"], bool) or top["version"] != FORMAT_VERSION):
            raise check.fail("version", f"unsupported registry version {top['version']!r}; "
                                        f"this service reads version {FORMAT_VERSION}")
        raw_points = check.mapping(top.get("operating_points") or {}, "operating_points")
        own = {
            name: _parse_point(name, raw, layout, check, _join("operating_points", name),
                               source="registry", strict=True)
            for name, raw in raw_points.items()
        }
        points = _merge(bundle, own)
        default = top.get("default_operating_point")
        if default is not None:
            check.string(default, "default_operating_point")
            if default not in points:
                raise check.fail(
                    "default_operating_point",
                    f"unknown operating point {default!r}; defined: {sorted(points)}",
                )
        raw_experiments = check.mapping(top.get("experiments") or {}, "experiments")
        experiments = {
            name: _parse_experiment(name, raw, points, check, _join("experiments", name))
            for name, raw in raw_experiments.items()
        }
        return cls(MappingProxyType(points), MappingProxyType(experiments), default, layout, source)

    @staticmethod
    def _parse_bundle_points(raw: Mapping[str, Any] | None, layout: SubspaceLayout
                             ) -> dict[str, OperatingPoint]:
        # Lenient about extra keys (training owns that section), strict about weights.
        if not raw:
            return {}
        check = _Checker("bundle manifest")
        body = check.mapping(raw, "operating_points")
        return {
            name: _parse_point(name, point, layout, check, _join("operating_points", name),
                               source="bundle", strict=False)
            for name, point in body.items()
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str], layout: SubspaceLayout,
             bundle_points: Mapping[str, Any] | None = None) -> Registry:
        """Read and validate a YAML or JSON registry file (see :mod:`.loader`)."""
        from service.registry.loader import load_document

        return cls.parse(load_document(path), layout, bundle_points, source=str(path))

    # --- queries ----------------------------------------------------------------------------
    def known_labels(self) -> list[tuple[str, str]]:
        """Every ``(experiment, arm)`` pair: the only label values the experiment counter may take."""
        return [(e.name, a.name) for e in self.experiments.values() for a in e.arms]

    def experiment(self, name: str, field: str = "experiment") -> Experiment:
        try:
            return self.experiments[name]
        except KeyError:
            raise ServiceError(
                ErrorKind.VALIDATION,
                f"unknown experiment {name!r}; defined: {sorted(self.experiments)}",
                field,
            ) from None

    def operating_point(self, name: str, field: str = "operating_point") -> OperatingPoint:
        try:
            return self.operating_points[name]
        except KeyError:
            raise ServiceError(
                ErrorKind.VALIDATION,
                f"unknown operating point {name!r}; defined: {sorted(self.operating_points)}",
                field,
            ) from None

    def assignment(self, experiment: str, unit_id: str, field: str = "") -> Assignment:
        """The arm of ``unit_id`` in ``experiment`` and whether the unit is inside its traffic."""
        exp = self.experiment(experiment, _join(field, "experiment"))
        if not isinstance(unit_id, str) or not unit_id:
            raise ServiceError(
                ErrorKind.VALIDATION,
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
            raise ServiceError(
                ErrorKind.VALIDATION,
                f"one source of weights per query: got {' and '.join(given)}; give weights, "
                "operating_point, or experiment with unit_id",
                _join(field, given[1]),
            )
        if unit_id is not None and experiment is None:
            raise ServiceError(
                ErrorKind.VALIDATION, "unit_id is only used together with experiment",
                _join(field, "unit_id"),
            )
        if experiment is not None:
            if unit_id is None:
                raise ServiceError(
                    ErrorKind.VALIDATION,
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
            raise ServiceError(ErrorKind.VALIDATION, str(exc), exc.field) from None
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
                    raise ServiceError(ErrorKind.VALIDATION, str(exc), exc.field) from None
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
            raise ServiceError(
                ErrorKind.NOT_READY,
                f"operating point {point.name!r} does not fit the served layout ({exc}); "
                "the registry is being re-validated against the new bundle",
            ) from None
