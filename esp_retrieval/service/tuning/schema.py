"""The registry file as strict pydantic models, and the rules that span its fields.

Strict means no coercion: a boolean is not a number, nor is the string ``"1e-3"`` (YAML 1.1
reads ``1e-3`` as a string; write ``1.0e-3``). Unknown keys are errors, so a typo never passes
silently. Rules that need more than the file travel in the validation context: the served
``layout`` (weights must name its subspaces and not be all zero once completed from its
defaults) and the names of the bundle's operating points (arms and ``default_operating_point``
may use them). :func:`validate_file` turns pydantic's errors into one :class:`RegistryError`
whose message names the source, the dotted field and what is allowed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from esp_retrieval.service.tuning.errors import RegistryError
from esp_retrieval.subspace.layout import SubspaceLayout

#: Names become metric label values and URL path segments: keep them short and plain.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SHARE_TOLERANCE = 1e-9
FORMAT_VERSION = 1


def _problem(message: str, *at: str | int) -> PydanticCustomError:
    """A rule broken; ``at`` is the path of the culprit below the object being validated."""
    return PydanticCustomError("registry", "{message}", {"message": message, "at": at})


def _name_rule(what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise _problem(f"{what} {value!r} is invalid: use 1-64 letters, digits, '_', '-' or '.', "
                           "starting with a letter or digit")
        return value

    return AfterValidator(check)


def _unit_interval(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise _problem(f"must be in [0, 1], got {value!r}")
    return value


def _json_value(value: Any, at: tuple[str | int, ...] = ()) -> Any:
    """Metrics are reported as JSON: plain scalars, lists and string-keyed mappings only."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _problem(f"must be finite, got {value!r}", *at)
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v, (*at, i)) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise _problem(f"keys must be strings, got {_kind(key)} {key!r}", *at)
        return {k: _json_value(v, (*at, k)) for k, v in value.items()}
    raise _problem(f"must be a JSON value, got {_kind(value)}", *at)


def _none_is_empty(value: Any) -> Any:
    return {} if value is None else value  # `experiments:` with nothing under it


PointName = Annotated[str, _name_rule("operating point name")]
ExperimentName = Annotated[str, _name_rule("experiment name")]
ArmName = Annotated[str, _name_rule("arm name")]
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Share = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Traffic = Annotated[float, AfterValidator(_unit_interval)]
Metrics = Annotated[dict[str, Any] | None, AfterValidator(_json_value)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class PointSpec(_Strict):
    """``operating_points.<name>``: weights by subspace name (the rest take the layout's defaults)."""

    weights: dict[str, Weight]
    description: str = ""
    metrics: Metrics = None

    @model_validator(mode="after")
    def _fits_layout(self, info: ValidationInfo) -> PointSpec:
        layout: SubspaceLayout = (info.context or {})["layout"]
        for name in self.weights:
            if name not in layout:
                raise _problem(f"unknown subspace {name!r}; valid names: {list(layout.names)}",
                               "weights", name)
        defaults = dict(zip(layout.names, layout.default_weights().tolist(), strict=True))
        if not any(w > 0 for w in {**defaults, **self.weights}.values()):
            raise _problem(f"all zero (after completing from the layout's defaults): at least one of "
                           f"{list(layout.names)} must be > 0", "weights")
        return self


class BundlePointSpec(PointSpec):
    """A point of the bundle manifest: training owns that section, so other keys are ignored."""

    model_config = ConfigDict(extra="ignore")


class ArmSpec(_Strict):
    name: ArmName
    share: Share
    operating_point: str


class ExperimentSpec(_Strict):
    """``experiments.<name>``: arms in order (the order fixes the bucket intervals)."""

    salt: Annotated[str, Field(min_length=1)]
    arms: Annotated[list[ArmSpec], Field(min_length=1)]
    default_arm: str | None = None
    traffic: Traffic = 1.0
    enabled: bool = True
    description: str = ""

    @model_validator(mode="after")
    def _arms_fit(self) -> ExperimentSpec:
        names = [a.name for a in self.arms]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _problem(f"duplicate arm name {name!r}", "arms", i, "name")
        total = math.fsum(a.share for a in self.arms)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise _problem(f"shares must sum to 1 (within {SHARE_TOLERANCE:g}), they sum to {total!r}",
                           "arms")
        if self.default_arm is not None and self.default_arm not in names:
            raise _problem(f"{self.default_arm!r} is not one of the arms {names}", "default_arm")
        if self.default_arm is None and (self.traffic < 1.0 or not self.enabled):
            raise _problem("required when traffic < 1 or enabled is false: excluded units need an arm "
                           "to be served", "default_arm")
        return self


class DesiredBundleSpec(_Strict):
    """``bundle``: the bundle every replica should serve (:mod:`esp_retrieval.service.rollout`)."""

    path: Annotated[str, Field(min_length=1, max_length=4096)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class RegistryFile(_Strict):
    """The whole file. Points and experiments keep the file's order."""

    version: int = FORMAT_VERSION
    bundle: DesiredBundleSpec | None = None
    default_operating_point: str | None = None
    operating_points: Annotated[dict[PointName, PointSpec], BeforeValidator(_none_is_empty)] = {}
    experiments: Annotated[dict[ExperimentName, ExperimentSpec], BeforeValidator(_none_is_empty)] = {}

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if isinstance(value, bool) or value != FORMAT_VERSION:
            raise _problem(f"unsupported registry version {value!r}; "
                           f"this service reads version {FORMAT_VERSION}")
        return value

    @model_validator(mode="after")
    def _points_exist(self, info: ValidationInfo) -> RegistryFile:
        known = set((info.context or {}).get("bundle_points", ())) | set(self.operating_points)
        default = self.default_operating_point
        if default is not None and default not in known:
            raise _problem(f"unknown operating point {default!r}; defined: {sorted(known)}",
                           "default_operating_point")
        for name, experiment in self.experiments.items():
            for i, arm in enumerate(experiment.arms):
                point = arm.operating_point
                if point not in known:
                    raise _problem(f"unknown operating point {point!r}; defined: {sorted(known)}",
                                   "experiments", name, "arms", i, "operating_point")
        return self


_BUNDLE_POINTS_TYPE = dict[PointName, BundlePointSpec]
_BUNDLE_POINTS = TypeAdapter(_BUNDLE_POINTS_TYPE, config=ConfigDict(strict=True))


def validate_file(data: Any, layout: SubspaceLayout, bundle_points: Collection[str], source: str
                  ) -> RegistryFile:
    """The registry document (parsed YAML/JSON), checked against ``layout``; ``bundle_points``
    are the names of the manifest's points. Raises :class:`RegistryError`."""
    try:
        return RegistryFile.model_validate(data, context={"layout": layout, "bundle_points": bundle_points})
    except ValidationError as exc:
        raise registry_error(exc, source) from None


def desired_bundle(data: Any, source: str) -> DesiredBundleSpec | None:
    """The file's ``bundle`` section (None when it has none), checked on its own: the rest of
    the file is validated against a layout by the registry watcher."""
    if not isinstance(data, Mapping) or data.get("bundle") is None:
        return None
    try:
        return DesiredBundleSpec.model_validate(data["bundle"])
    except ValidationError as exc:
        raise registry_error(exc, source, ("bundle",), DesiredBundleSpec) from None


def validate_bundle_points(raw: Any, layout: SubspaceLayout) -> dict[str, BundlePointSpec]:
    """The manifest's ``operating_points`` section, with the file's rules on weights."""
    try:
        return _BUNDLE_POINTS.validate_python(raw, context={"layout": layout})
    except ValidationError as exc:
        raise registry_error(exc, "bundle manifest", ("operating_points",), _BUNDLE_POINTS_TYPE) from None


# --- pydantic's errors as one message ----------------------------------------------------------

_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}


def registry_error(exc: ValidationError, source: str, prefix: tuple[str | int, ...] = (),
                   root: Any = RegistryFile) -> RegistryError:
    """The first problem's field and message (``source: field: problem``), the next two after it.

    Missing and unknown keys of one mapping are reported together, at the mapping, with the
    allowed keys (``root`` is the model the error locations start from).
    """
    problems: dict[Any, tuple[tuple[Any, ...], str]] = {}
    keys: dict[tuple[str, tuple[Any, ...]], list[str]] = {}
    for i, err in enumerate(exc.errors(include_url=False)):
        loc = tuple(err["loc"])
        if err["type"] in ("missing", "extra_forbidden"):
            group = keys.setdefault((err["type"], loc[:-1]), [])
            group.append(str(loc[-1]))
            problems[(err["type"], loc[:-1])] = (loc[:-1], _key_problem(err["type"], group, root, loc[:-1]))
        elif loc[-1:] == ("[key]",) and err["type"] == "string_type":
            problems[i] = (loc[:-2], f"keys must be strings, got {_kind(err['input'])} {err['input']!r}")
        elif loc[-1:] == ("[key]",):  # a bad name: reported at the key itself
            problems[i] = (loc[:-1], _describe(err))
        else:
            problems[i] = ((*loc, *(err.get("ctx") or {}).get("at", ())), _describe(err))
    described = [(_dotted((*prefix, *loc)), problem) for loc, problem in problems.values()]
    field, message = described[0]
    text = f"{source}: {field}: {message}" if field else f"{source}: {message}"
    if len(described) > 1:
        text += "; also: " + "; ".join(f"{f or '(top level)'}: {m}" for f, m in described[1:3])
        if len(described) > 3:
            text += f" (+{len(described) - 3} more)"
    return RegistryError(text, field or None)


def _describe(err: Any) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    got = f"{_kind(value)} {value!r}"
    if kind == "registry":
        return str(ctx["message"])
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return f"must be {op} {ctx[key]:g}, got {value!r}"
    if kind in ("float_type", "int_type"):
        hint = " (YAML 1.1 reads 1e-3 as a string: write 1.0e-3)" if _looks_numeric(value) else ""
        return f"must be a number, got {got}{hint}"
    simple = {
        "finite_number": f"must be finite, got {value!r}",
        "string_type": f"must be a string, got {got}",
        "bool_type": f"must be true or false, got {got}",
        "dict_type": f"must be a mapping, got {_kind(value)}",
        "model_type": f"must be a mapping, got {_kind(value)}",
        "list_type": f"must be a list, got {_kind(value)}",
        "string_too_short": "must be a non-empty string",
        "too_short": "must be a non-empty list",
    }
    return simple.get(kind, str(err["msg"]))


def _key_problem(kind: str, names: list[str], root: Any, loc: tuple[Any, ...]) -> str:
    if kind == "missing":
        return f"missing required key(s) {sorted(names)}"
    model = _model_at(root, loc)
    allowed = f"; allowed: {sorted(model.model_fields)}" if model is not None else ""
    return f"unknown key(s) {sorted(names)}{allowed}"


def _model_at(root: Any, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model validated at ``loc``, stepping through fields, mapping values and list items."""
    node = root
    for part in loc:
        if isinstance(node, type) and issubclass(node, BaseModel):
            if part not in node.model_fields:
                return None
            node = node.model_fields[part].annotation
        else:
            args = get_args(node)
            if not args:
                return None
            node = args[-1]
        while get_origin(node) is Annotated:
            node = get_args(node)[0]
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else f"{out}.{part}" if out else str(part)
    return out


def _kind(value: Any) -> str:
    return {bool: "boolean", str: "string", int: "integer", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _looks_numeric(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)
