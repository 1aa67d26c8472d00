"""Structured metadata filters: the request model, validation against declared fields, and two
evaluations that agree (docs/architecture.md section 3).

A filter is a tree of JSON objects::

    {"field": "lang", "eq": "en"}                       equality
    {"field": "lang", "in": ["en", "de"]}               membership
    {"field": "year", "gte": 2019, "lt": 2024}          numeric range (gt, gte, lt, lte)
    {"field": "published", "gte": "2024-01-01"}         date range (ISO 8601 strings)
    {"and": [f, ...]}, {"or": [f, ...]}, {"not": f}

It is checked against the metadata fields a bundle declares (:class:`MetadataSchema`: the
manifest's ``metadata.fields``, else inferred from ``docs.jsonl``) and compiled to a tree of
:class:`Node` s, which evaluate two ways:

* :meth:`Node.mask` over a :class:`MetadataTable` (columns built once from the bundle's docs):
  an exact ``(N,)`` boolean row mask for the in-process backends. A string field is held as one
  integer code per row and a value -> code dict, so ``eq`` and ``in`` (up to
  :data:`MAX_IN_VALUES` values) cost a dict lookup per value and one gather over the rows,
  whatever the strings' lengths;
* :func:`milvus_expression`: the same predicate as a Milvus boolean expression, values quoted
  safely, negation pushed down to the leaves (Milvus Lite's engine has no ``not``).

Semantics (both evaluations): a condition holds only for a document that *has* the field and
whose value satisfies it; ``not`` is the complement, so ``not {"field": "lang", "eq": "en"}``
also matches documents without ``lang``. Dates compare as UTC instants (a date alone is its
midnight; a time without offset is UTC), stored as integer microseconds since the epoch.

The display text is not filterable unless the bundle says so: a field of type ``text`` is
stored and returned (a hit's ``fields``, a Milvus column) but no filter may name it, and
inference gives the ``docs.jsonl`` key ``text`` that type. A manifest that declares
``"text": "string"`` in ``metadata.fields`` makes it filterable.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    model_validator,
)

from esp_retrieval.subspace.errors import FieldError

MAX_IN_VALUES = 1024
MAX_NODES = 256
MAX_STRING_BYTES = 65535  # Milvus VARCHAR's largest max_length
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RESERVED_PREFIX = "esp_"  # the Milvus collection's own fields (id, row, vector, presence flags)
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_I64 = 2**63


class FilterError(FieldError):
    """A filter that cannot be applied; ``field`` is its dotted path (``filter.and[1].field``)."""


class FieldType(StrEnum):
    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    DATE = "date"
    #: a string stored and returned with hits but never filtered on (the display text)
    TEXT = "text"


#: The ``docs.jsonl`` key of a document's display text: inferred as :attr:`FieldType.TEXT`.
DISPLAY_TEXT = "text"

_RANGED = (FieldType.INT, FieldType.FLOAT, FieldType.DATE)


# --- the request model ------------------------------------------------------------------------
_Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Scalar = Annotated[StrictBool | StrictInt | _Number | StrictStr, Field(union_mode="left_to_right")]
Bound = Annotated[StrictInt | _Number | StrictStr, Field(union_mode="left_to_right")]
FieldName = Annotated[str, Field(strict=True, min_length=1, max_length=64)]


class Condition(BaseModel):
    """One test of one field: ``eq``, ``in``, or a range (any of ``gt``, ``gte``, ``lt``, ``lte``)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    field: FieldName = Field(description="a metadata field the bundle declares (GET /v1/layout lists them)")
    eq: Scalar | None = Field(None, description="equal to this value")
    in_: list[Scalar] | None = Field(
        None, alias="in", min_length=1, max_length=MAX_IN_VALUES, description="equal to one of these"
    )
    gt: Bound | None = Field(None, description="greater than (number, or ISO 8601 date)")
    gte: Bound | None = Field(None, description="greater than or equal")
    lt: Bound | None = Field(None, description="less than")
    lte: Bound | None = Field(None, description="less than or equal")

    @model_validator(mode="after")
    def _one_kind(self) -> Condition:
        ranged = any(v is not None for v in (self.gt, self.gte, self.lt, self.lte))
        kinds = (self.eq is not None) + (self.in_ is not None) + ranged
        if kinds != 1:
            raise ValueError("give exactly one of 'eq', 'in', or range bounds ('gt', 'gte', 'lt', 'lte')")
        if (self.gt is not None and self.gte is not None) or (self.lt is not None and self.lte is not None):
            raise ValueError(
                "give at most one lower bound ('gt' or 'gte') and one upper bound ('lt' or 'lte')"
            )
        return self


def _filter_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return {Condition: "Field-Test", AllOf: "All-Of", AnyOf: "Any-Of", NoneOf: "Not-Of"}.get(type(value))
    if not isinstance(value, dict):
        return None
    for key, tag in (("and", "All-Of"), ("or", "Any-Of"), ("not", "Not-Of"), ("field", "Field-Test")):
        if key in value:
            return tag
    return None


class AllOf(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    and_: list[Filter] = Field(alias="and", min_length=1, max_length=MAX_NODES, description="all must hold")


class AnyOf(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    or_: list[Filter] = Field(alias="or", min_length=1, max_length=MAX_NODES, description="one must hold")


class NoneOf(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    not_: Filter = Field(alias="not", description="must not hold")


Filter = Annotated[
    Annotated[Condition, Tag("Field-Test")]
    | Annotated[AllOf, Tag("All-Of")]
    | Annotated[AnyOf, Tag("Any-Of")]
    | Annotated[NoneOf, Tag("Not-Of")],
    Discriminator(
        _filter_tag,
        custom_error_type="filter_type",
        custom_error_message="must be an object with 'field' (a condition), 'and', 'or' or 'not'",
    ),
]
AllOf.model_rebuild()
AnyOf.model_rebuild()
NoneOf.model_rebuild()

#: Discriminator tags of :data:`Filter`; they appear in pydantic's error locations.
FILTER_TAGS = frozenset({"Field-Test", "All-Of", "Any-Of", "Not-Of"})


# --- declared fields ---------------------------------------------------------------------------
def parse_date(value: str) -> int:
    """ISO 8601 date or date-time -> integer microseconds since the epoch (UTC)."""
    if not _ISO_DATE.match(value):
        raise ValueError(f"{value!r} is not an ISO 8601 date (YYYY-MM-DD[THH:MM[:SS[.ffffff]]][Z|+HH:MM])")
    parsed = datetime.fromisoformat(value.replace(" ", "T"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // _MICRO


_MICRO = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - _EPOCH


def format_date(micros: int) -> str:
    return (_EPOCH + micros * _MICRO).isoformat().replace("+00:00", "Z")


def _value_type(value: Any) -> FieldType | None:
    if isinstance(value, bool):
        return FieldType.BOOL
    if isinstance(value, int):
        return FieldType.INT
    if isinstance(value, float):
        return FieldType.FLOAT if math.isfinite(value) else None
    if isinstance(value, str):
        return FieldType.DATE if _ISO_DATE.match(value) else FieldType.STRING
    return None


def _merge(a: FieldType | None, b: FieldType | None) -> FieldType | None:
    if a is None or b is None or a == b:
        return a if b is None else b if a is None else a
    pair = {a, b}
    if pair == {FieldType.INT, FieldType.FLOAT}:
        return FieldType.FLOAT
    if pair == {FieldType.STRING, FieldType.DATE}:
        return FieldType.STRING
    raise TypeError(f"mixed {a} and {b}")


@dataclass(frozen=True)
class MetadataSchema:
    """The filterable fields of a corpus: name -> type, in a stable order."""

    fields: Mapping[str, FieldType]

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    def names(self) -> list[str]:
        return list(self.fields)

    def filterable(self) -> list[str]:
        """The fields a filter may name: all but those of type ``text``."""
        return [k for k, v in self.fields.items() if v != FieldType.TEXT]

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.fields.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "metadata.fields") -> MetadataSchema:
        out: dict[str, FieldType] = {}
        for name, kind in data.items():
            check_field_name(name, where)
            try:
                out[name] = FieldType(kind)
            except ValueError as exc:
                raise FilterError(
                    f"{where}.{name}: type {kind!r} is unknown; allowed: {[t.value for t in FieldType]}",
                    f"{where}.{name}",
                ) from exc
        return cls(out)

    @classmethod
    def infer(cls, docs: Iterable[Mapping[str, Any]] | None) -> MetadataSchema:
        """The keys of ``docs`` whose non-null values share one scalar type (ints and floats ->
        float; strings that are all ISO dates -> date), with names a Milvus field may have; the
        display text (:data:`DISPLAY_TEXT`) is of type ``text``, not filterable."""
        types: dict[str, FieldType | None] = {}
        mixed: set[str] = set()
        for doc in docs or ():
            for key, value in doc.items():
                if key in mixed or value is None:
                    continue
                kind = _value_type(value)
                try:
                    if kind is None:
                        raise TypeError("not a scalar")
                    types[key] = _merge(types.get(key), kind)
                except TypeError:
                    mixed.add(key)
                    types.pop(key, None)
        ok = {k: v for k, v in types.items() if v is not None and _valid_name(k)}
        if ok.get(DISPLAY_TEXT) in (FieldType.STRING, FieldType.DATE):
            ok[DISPLAY_TEXT] = FieldType.TEXT  # not filterable unless declared (module doc)
        return cls(ok)

    @classmethod
    def of_bundle(
        cls, manifest: Mapping[str, Any], docs: Sequence[Mapping[str, Any]] | None
    ) -> MetadataSchema:
        """The manifest's ``metadata.fields`` when declared, else :meth:`infer` over the docs."""
        declared = (manifest.get("metadata") or {}).get("fields") if isinstance(manifest, Mapping) else None
        if isinstance(declared, Mapping):
            return cls.from_dict(declared)
        return cls.infer(docs)


def _valid_name(name: str) -> bool:
    return bool(FIELD_NAME.match(name)) and not name.startswith(RESERVED_PREFIX)


def check_field_name(name: str, where: str) -> None:
    if not _valid_name(name):
        raise FilterError(
            f"{where}: field name {name!r} must match {FIELD_NAME.pattern} and not start with "
            f"{RESERVED_PREFIX!r}",
            where,
        )


def coerce_value(kind: FieldType, value: Any, where: str) -> Any:
    """A stored or compared value of a field of type ``kind``: str, int, float, bool, or int
    microseconds for a date. Raises :class:`FilterError` naming ``where``."""
    ok: Any
    if kind == FieldType.BOOL:
        ok = value if isinstance(value, bool) else None
    elif kind == FieldType.INT:
        ok = (
            value
            if isinstance(value, int) and not isinstance(value, bool) and -_I64 <= value < _I64
            else None
        )
    elif kind == FieldType.FLOAT:
        ok = _finite_float(value)
    elif kind == FieldType.DATE:
        try:
            ok = parse_date(value) if isinstance(value, str) else None
        except ValueError:
            ok = None
    else:
        ok = value if isinstance(value, str) and len(value.encode("utf-8")) <= MAX_STRING_BYTES else None
    if ok is None:
        shown = repr(value)
        if len(shown) > 60:  # a 401-digit integer need not come back in full
            shown = f"{shown[:40]}... ({len(shown)} characters)"
        raise FilterError(f"{where}: {shown} is not a valid {kind} value", where)
    return ok


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float; ``None`` for a bool, a non-number, NaN, an infinity or an
    integer beyond float64's range (JSON has no limit on an integer's digits)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


# --- the compiled tree -------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    def mask(self, table: MetadataTable) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def fields(self) -> set[str]:
        return set()


@dataclass(frozen=True)
class Eq(Node):
    field: str
    kind: FieldType
    value: Any

    def mask(self, table: MetadataTable) -> np.ndarray:
        if self.kind == FieldType.STRING:
            return table.matching(self.field, (self.value,))
        col, present = table.column(self.field)
        return present & (col == self.value)

    def fields(self) -> set[str]:
        return {self.field}


@dataclass(frozen=True)
class In(Node):
    field: str
    kind: FieldType
    values: tuple[Any, ...]

    def mask(self, table: MetadataTable) -> np.ndarray:
        if self.kind == FieldType.STRING:
            return table.matching(self.field, self.values)
        col, present = table.column(self.field)
        return present & np.isin(col, np.asarray(self.values, col.dtype))

    def fields(self) -> set[str]:
        return {self.field}


@dataclass(frozen=True)
class Range(Node):
    field: str
    kind: FieldType
    lo: Any = None
    lo_inclusive: bool = True
    hi: Any = None
    hi_inclusive: bool = True

    def mask(self, table: MetadataTable) -> np.ndarray:
        col, present = table.column(self.field)
        out = present.copy()
        if self.lo is not None:
            out &= (col >= self.lo) if self.lo_inclusive else (col > self.lo)
        if self.hi is not None:
            out &= (col <= self.hi) if self.hi_inclusive else (col < self.hi)
        return out

    def fields(self) -> set[str]:
        return {self.field}


@dataclass(frozen=True)
class And(Node):
    children: tuple[Node, ...]

    def mask(self, table: MetadataTable) -> np.ndarray:
        out = self.children[0].mask(table).copy()
        for c in self.children[1:]:
            out &= c.mask(table)
        return out

    def fields(self) -> set[str]:
        return set().union(*(c.fields() for c in self.children))


@dataclass(frozen=True)
class Or(Node):
    children: tuple[Node, ...]

    def mask(self, table: MetadataTable) -> np.ndarray:
        out = self.children[0].mask(table).copy()
        for c in self.children[1:]:
            out |= c.mask(table)
        return out

    def fields(self) -> set[str]:
        return set().union(*(c.fields() for c in self.children))


@dataclass(frozen=True)
class Not(Node):
    child: Node

    def mask(self, table: MetadataTable) -> np.ndarray:
        return ~self.child.mask(table)

    def fields(self) -> set[str]:
        return self.child.fields()


@dataclass(frozen=True)
class CompiledFilter:
    """A validated filter: its tree, and a canonical key (equal filters, equal keys)."""

    root: Node
    key: str

    def mask(self, table: MetadataTable) -> np.ndarray:
        return self.root.mask(table)

    def expression(self) -> str:
        return milvus_expression(self.root)


def _int_bound(op: str, bound: int | float) -> int:
    """An integer field against a float bound: the equivalent integer bound (exact)."""
    if isinstance(bound, int):
        return bound
    return math.floor(bound) if op in ("gt", "lte") else math.ceil(bound)


def compile_filter(spec: Any, schema: MetadataSchema, where: str = "filter") -> CompiledFilter:
    """Check ``spec`` (a :data:`Filter` model or its JSON) against ``schema``; the compiled tree.

    Raises :class:`FilterError` naming the path of the first problem (unknown field, a value
    of the wrong type, a range on a string field, too many nodes).
    """
    if isinstance(spec, Mapping):
        from pydantic import TypeAdapter, ValidationError

        try:
            spec = TypeAdapter(Filter).validate_python(spec)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = "".join(
                f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"] if p not in FILTER_TAGS
            )
            raise FilterError(f"{where}{loc}: {err['msg']}", f"{where}{loc}") from exc
    count = [0]
    root = _compile(spec, schema, where, count)
    return CompiledFilter(root, json.dumps(_canonical(spec), sort_keys=True, separators=(",", ":")))


def _canonical(spec: Any) -> Any:
    if isinstance(spec, BaseModel):
        return {k: _canonical(v) for k, v in spec.model_dump(by_alias=True, exclude_none=True).items()}
    return spec


def _compile(spec: Any, schema: MetadataSchema, where: str, count: list[int]) -> Node:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise FilterError(f"{where}: the filter has more than {MAX_NODES} nodes", where)
    if isinstance(spec, AllOf):
        return And(tuple(_compile(c, schema, f"{where}.and[{i}]", count) for i, c in enumerate(spec.and_)))
    if isinstance(spec, AnyOf):
        return Or(tuple(_compile(c, schema, f"{where}.or[{i}]", count) for i, c in enumerate(spec.or_)))
    if isinstance(spec, NoneOf):
        return Not(_compile(spec.not_, schema, f"{where}.not", count))
    assert isinstance(spec, Condition)
    name = spec.field
    if name not in schema:
        known = schema.filterable()
        raise FilterError(
            f"{where}.field: {name!r} is not a metadata field of this corpus; "
            + (f"filterable fields: {known}" if known else "it declares none (no docs.jsonl fields)"),
            f"{where}.field",
        )
    kind = schema.fields[name]
    if kind == FieldType.TEXT:
        raise FilterError(
            f"{where}.field: {name!r} is display text (type text), not filterable: a bundle makes it "
            f"filterable by declaring it a string in its manifest's metadata.fields; filterable "
            f"fields: {schema.filterable()}",
            f"{where}.field",
        )
    for i, v in enumerate([spec.eq] if spec.in_ is None else spec.in_):
        if isinstance(v, str) and ("\n" in v or "\r" in v):
            at = f"{where}.eq" if spec.in_ is None else f"{where}.in[{i}]"
            raise FilterError(f"{at}: filter values cannot contain line breaks", at)
    if spec.eq is not None:
        return Eq(name, kind, coerce_value(kind, spec.eq, f"{where}.eq"))
    if spec.in_ is not None:
        values = tuple(coerce_value(kind, v, f"{where}.in[{i}]") for i, v in enumerate(spec.in_))
        return In(name, kind, tuple(dict.fromkeys(values)))
    if kind not in _RANGED:
        op = next(o for o in ("gt", "gte", "lt", "lte") if getattr(spec, o) is not None)
        raise FilterError(
            f"{where}.{op}: field {name!r} is {kind}; ranges apply to int, float and date fields",
            f"{where}.{op}",
        )
    bounds: dict[str, Any] = {}
    for op in ("gt", "gte", "lt", "lte"):
        raw = getattr(spec, op)
        if raw is None:
            continue
        if kind == FieldType.INT:
            if not isinstance(raw, int | float):
                raise FilterError(
                    f"{where}.{op}: {raw!r} is not a number (field {name!r} is int)", f"{where}.{op}"
                )
            bounds[op] = coerce_value(kind, _int_bound(op, raw), f"{where}.{op}")
        else:
            bounds[op] = coerce_value(kind, raw, f"{where}.{op}")
    lo_op = "gt" if "gt" in bounds else "gte" if "gte" in bounds else None
    hi_op = "lt" if "lt" in bounds else "lte" if "lte" in bounds else None
    return Range(
        name,
        kind,
        lo=bounds.get(lo_op) if lo_op else None,
        lo_inclusive=lo_op != "gt",
        hi=bounds.get(hi_op) if hi_op else None,
        hi_inclusive=hi_op != "lt",
    )


# --- in-process evaluation ---------------------------------------------------------------------
_FILL: dict[FieldType, tuple[Any, Any]] = {
    FieldType.INT: (np.int64, 0),
    FieldType.FLOAT: (np.float64, 0.0),
    FieldType.BOOL: (np.bool_, False),
    FieldType.DATE: (np.int64, 0),
}


class MetadataTable:
    """The filterable fields over ``N`` rows: ``(values, present)`` per number, bool or date
    field; per string field one ``int32`` code per row (``-1``: no value) and a value -> code
    dict (its keys are the docs' own strings, not copies). ``text`` fields are not held."""

    def __init__(
        self, schema: MetadataSchema, docs: Sequence[Mapping[str, Any]] | None, num_rows: int
    ) -> None:
        self.schema = schema
        self.num_rows = num_rows
        self._columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._codes: dict[str, tuple[np.ndarray, dict[str, int]]] = {}
        docs = docs if docs is not None else [{}] * num_rows
        if len(docs) != num_rows:
            raise FilterError(f"docs: {len(docs)} rows for {num_rows} corpus rows", "docs")
        for name, kind in schema.fields.items():
            if kind == FieldType.TEXT:
                continue
            if kind == FieldType.STRING:
                codes = np.full(num_rows, -1, dtype=np.int32)
                index: dict[str, int] = {}
                for i, value in _stored(kind, name, docs):
                    codes[i] = index.setdefault(value, len(index))
                self._codes[name] = (codes, index)
                continue
            dtype, fill = _FILL[kind]
            values = np.full(num_rows, fill, dtype=dtype)
            present = np.zeros(num_rows, dtype=bool)
            for i, value in _stored(kind, name, docs):
                values[i] = value
                present[i] = True
            self._columns[name] = (values, present)

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(values, present)`` of a number, bool or date field."""
        return self._columns[name]

    def matching(self, name: str, values: Iterable[str]) -> np.ndarray:
        """The rows whose string field ``name`` equals one of ``values``: ``(N,)`` bool."""
        codes, index = self._codes[name]
        wanted = np.zeros(len(index) + 1, dtype=bool)  # its last entry stays False: code -1, no value
        for value in values:
            code = index.get(value)
            if code is not None:
                wanted[code] = True
        return wanted[codes]

    @property
    def nbytes(self) -> int:
        """Bytes of the table's arrays (the string dicts' keys are the docs' own strings)."""
        arrays = [a for pair in self._columns.values() for a in pair]
        return sum(a.nbytes for a in arrays) + sum(c.nbytes for c, _ in self._codes.values())


def _stored(kind: FieldType, name: str, docs: Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, Any]]:
    """``(row, stored value)`` of each document with a valid value of field ``name``; a value of
    another type never matches (the schema was declared, or inferred from other rows)."""
    for i, doc in enumerate(docs):
        value = doc.get(name)
        if value is None:
            continue
        try:
            yield i, coerce_value(kind, value, f"docs[{i}].{name}")
        except FilterError:
            continue


# --- Milvus expressions ------------------------------------------------------------------------
def presence_field(name: str) -> str:
    """The Milvus boolean field that says whether a document has ``name``."""
    return f"{RESERVED_PREFIX}has_{name}"


def quote(value: Any) -> str:
    """A literal of Milvus' expression language: strings double-quoted, with ``\\`` and ``\"``
    escaped and every other character as itself (Milvus unescapes only those two; a raw line
    break ends the expression, so such values are refused), numbers exactly, booleans lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite literal")
        return repr(float(value))
    if isinstance(value, str):
        if "\n" in value or "\r" in value:
            raise ValueError("a string literal cannot hold a line break")
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"no literal for {type(value).__name__}")


def milvus_expression(node: Node, negate: bool = False) -> str:
    """``node`` as a Milvus filter expression, negations pushed to the leaves (De Morgan)."""
    if isinstance(node, Not):
        return milvus_expression(node.child, not negate)
    if isinstance(node, And | Or):
        joiner = " and " if isinstance(node, And) != negate else " or "
        return "(" + joiner.join(milvus_expression(c, negate) for c in node.children) + ")"
    assert isinstance(node, Eq | In | Range)
    has = presence_field(node.field)
    f = node.field
    if isinstance(node, Eq):
        test = f"{f} {'!=' if negate else '=='} {quote(node.value)}"
    elif isinstance(node, In):
        test = f"{f} {'not in' if negate else 'in'} [{', '.join(quote(v) for v in node.values)}]"
    else:
        parts = []
        if node.lo is not None:
            parts.append((">=" if node.lo_inclusive else ">", node.lo))
        if node.hi is not None:
            parts.append(("<=" if node.hi_inclusive else "<", node.hi))
        if not negate:
            test = " and ".join(f"{f} {op} {quote(v)}" for op, v in parts)
        else:
            flip = {">=": "<", ">": "<=", "<=": ">", "<": ">="}
            test = " or ".join(f"{f} {flip[op]} {quote(v)}" for op, v in parts)
    if negate:
        return f"({has} == false or ({test}))"
    return f"({has} == true and ({test}))"


def allowed_rows_expression(mask: np.ndarray, row_field: str) -> str:
    """An explicit row mask as an expression over ``row_field`` (for small masks)."""
    rows = np.flatnonzero(mask)
    return f"{row_field} in [{', '.join(str(int(r)) for r in rows)}]"


__all__ = [
    "DISPLAY_TEXT",
    "FILTER_TAGS",
    "AllOf",
    "AnyOf",
    "CompiledFilter",
    "Condition",
    "FieldType",
    "Filter",
    "FilterError",
    "MetadataSchema",
    "MetadataTable",
    "NoneOf",
    "compile_filter",
    "format_date",
    "milvus_expression",
    "parse_date",
    "presence_field",
    "quote",
]
