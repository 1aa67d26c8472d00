"""Metadata filters: validation names the field, masks follow the documented semantics, and the
Milvus expression says the same thing (negation pushed down, values quoted)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from esp_retrieval.subspace.filters import (
    FieldType,
    FilterError,
    MetadataSchema,
    MetadataTable,
    compile_filter,
    milvus_expression,
    parse_date,
    quote,
)

DOCS: list[dict[str, Any]] = [
    {"lang": "en", "year": 2019, "score": 1.5, "published": "2024-01-02", "flag": True, "tags": ["a"]},
    {"lang": "de", "year": 2020, "score": 2, "published": "2024-03-01T10:00:00Z"},
    {"lang": "fr", "year": 2021},
    {},
    {"lang": 'say "hi"\\', "year": 1999, "flag": False, "bad name": 1},
]


def test_the_schema_is_inferred_from_the_docs() -> None:
    schema = MetadataSchema.infer(DOCS)
    assert schema.to_dict() == {
        "lang": "string",
        "year": "int",
        "score": "float",
        "published": "date",
        "flag": "bool",
    }  # lists and names Milvus cannot hold are not filterable
    declared = MetadataSchema.of_bundle({"metadata": {"fields": {"year": "int"}}}, DOCS)
    assert declared.to_dict() == {"year": "int"}
    with pytest.raises(FilterError, match="unknown"):
        MetadataSchema.from_dict({"year": "integer"})
    with pytest.raises(FilterError, match="esp_"):
        MetadataSchema.from_dict({"esp_row": "int"})


def mask(spec: dict[str, Any]) -> list[bool]:
    schema = MetadataSchema.infer(DOCS)
    return compile_filter(spec, schema).mask(MetadataTable(schema, DOCS, len(DOCS))).tolist()


def test_conditions_hold_only_where_the_field_is_present_and_not_complements() -> None:
    assert mask({"field": "lang", "eq": "en"}) == [True, False, False, False, False]
    assert mask({"not": {"field": "lang", "eq": "en"}}) == [False, True, True, True, True]
    assert mask({"field": "lang", "in": ["de", 'say "hi"\\']}) == [False, True, False, False, True]
    assert mask({"field": "score", "lt": 1.6}) == [True, False, False, False, False]
    assert mask({"not": {"field": "score", "lt": 1.6}}) == [False, True, True, True, True]
    assert mask({"field": "year", "gt": 2019.5}) == [
        False,
        True,
        True,
        False,
        False,
    ]  # int field, float bound
    assert mask({"field": "published", "gte": "2024-01-02T00:00:00Z", "lt": "2024-03-01T10:00:00Z"}) == [
        True,
        False,
        False,
        False,
        False,
    ]
    assert mask({"field": "flag", "eq": False}) == [False, False, False, False, True]
    assert mask({"or": [{"field": "flag", "eq": True}, {"field": "year", "eq": 2021}]}) == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert mask({"and": [{"field": "year", "gte": 2019}, {"not": {"field": "lang", "in": ["de"]}}]}) == [
        True,
        False,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"field": "nope", "eq": 1}, "filter.field"),
        ({"field": "year", "eq": "2019"}, "filter.eq"),
        ({"field": "year", "eq": True}, "filter.eq"),
        ({"and": [{"field": "lang", "eq": "en"}, {"field": "lang", "gt": 1}]}, "filter.and[1].gt"),
        ({"field": "published", "gte": "yesterday"}, "filter.gte"),
        ({"not": {"field": "lang", "in": ["en", "a\nb"]}}, "filter.not.in[1]"),
        ({"field": "year", "eq": 1, "in": [2]}, "filter"),
        ({"field": "year", "gt": 1, "gte": 2}, "filter"),
        ({"fields": "year"}, "filter"),
        ({"field": "year", "gt": float("nan")}, "filter.gt"),
        ({"field": "score", "eq": 10**400}, "filter.eq"),  # an integer beyond float64
        ({"field": "score", "gte": -(10**400)}, "filter.gte"),
        ({"field": "score", "in": [1.5, 10**400]}, "filter.in[1]"),
    ],
)
def test_bad_filters_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(FilterError) as exc:
        compile_filter(spec, MetadataSchema.infer(DOCS))
    assert exc.value.field is not None and exc.value.field.startswith(field), exc.value.field


def test_the_milvus_expression_pushes_negation_to_the_leaves() -> None:
    schema = MetadataSchema.infer(DOCS)
    spec = {"not": {"and": [{"field": "lang", "eq": 'a"b'}, {"field": "year", "gte": 2000, "lt": 2010}]}}
    expr = milvus_expression(compile_filter(spec, schema).root)
    assert "not" not in expr.replace("not in", "")
    assert expr == (
        '((esp_has_lang == false or (lang != "a\\"b")) or '
        "(esp_has_year == false or (year < 2000 or year >= 2010)))"
    )
    assert quote("back\\slash") == '"back\\\\slash"' and quote(True) == "true" and quote(0.1) == "0.1"
    with pytest.raises(ValueError):
        quote("line\nbreak")


def test_equal_filters_have_equal_keys_and_dates_are_utc_microseconds() -> None:
    schema = MetadataSchema.infer(DOCS)
    a = compile_filter({"field": "year", "in": [1, 2]}, schema)
    b = compile_filter({"in": [1, 2], "field": "year"}, schema)
    assert a.key == b.key != compile_filter({"field": "year", "in": [2, 1]}, schema).key
    assert parse_date("1970-01-02") == 86_400 * 10**6
    assert parse_date("1970-01-01T01:00:00+01:00") == 0
    assert MetadataSchema.infer(DOCS).fields["published"] is FieldType.DATE
    table = MetadataTable(schema, DOCS, len(DOCS))
    values, present = table.column("published")
    assert present.tolist() == [True, True, False, False, False]
    assert values[0] == parse_date("2024-01-02") and np.issubdtype(values.dtype, np.integer)


TEXT_DOCS: list[dict[str, Any]] = [
    {"text": "a long display body", "lang": "en"},
    {"text": "another body", "lang": "de"},
    {"lang": "en"},
    {"text": "a long display body"},
]


def test_the_display_text_is_not_filterable_unless_the_bundle_declares_it() -> None:
    inferred = MetadataSchema.infer(TEXT_DOCS)
    assert inferred.to_dict() == {"text": "text", "lang": "string"}  # listed, returned, stored
    assert inferred.filterable() == ["lang"]
    with pytest.raises(FilterError, match="not filterable") as exc:
        compile_filter({"or": [{"field": "lang", "eq": "en"}, {"field": "text", "in": ["x"]}]}, inferred)
    assert exc.value.field == "filter.or[1].field"
    assert "'lang'" in str(exc.value)  # the fields a filter may name
    table = MetadataTable(inferred, TEXT_DOCS, len(TEXT_DOCS))
    assert table.nbytes == len(TEXT_DOCS) * 4  # lang's codes: no column of the texts
    declared = MetadataSchema.of_bundle({"metadata": {"fields": {"text": "string"}}}, TEXT_DOCS)
    spec = {"field": "text", "in": ["a long display body", "not there"]}
    got = compile_filter(spec, declared).mask(MetadataTable(declared, TEXT_DOCS, len(TEXT_DOCS)))
    assert got.tolist() == [True, False, False, True]


def test_string_conditions_match_through_the_value_index() -> None:
    docs: list[dict[str, Any]] = [{"tag": f"t{i % 7}"} for i in range(50)] + [{}, {"tag": 3}, {"tag": ""}]
    schema = MetadataSchema.from_dict({"tag": "string"})
    table = MetadataTable(schema, docs, len(docs))
    tags = [d.get("tag") for d in docs]
    values = [f"t{i}" for i in range(0, 1024, 3)] + ["", "nope"]  # at the limit, most absent
    for spec, expected in [
        ({"field": "tag", "in": values}, [t in values for t in tags]),
        ({"field": "tag", "eq": "t6"}, [t == "t6" for t in tags]),
        ({"field": "tag", "eq": "missing"}, [False] * len(docs)),
        ({"not": {"field": "tag", "in": ["t1", ""]}}, [t not in ("t1", "") for t in tags]),
    ]:
        assert compile_filter(spec, schema).mask(table).tolist() == expected, spec
