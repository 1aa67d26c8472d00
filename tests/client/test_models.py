"""esp_retrieval/client/models.py covers the server's response schemas (esp_retrieval/service/schemas.py), so they cannot drift.

Read on the JSON schemas: every field the server's model has is in the SDK's model, with a type
that accepts what the server sends (an integer is a number; the SDK may be wider, never
narrower), and the SDK requires no field the server may leave out. The SDK keeps unknown fields.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import esp_retrieval.client.models as sdk
import esp_retrieval.service.schemas as server

PAIRS = [
    (server.SearchResponse, sdk.SearchResponse),
    (server.LayoutResponse, sdk.LayoutResponse),
    (server.Health, sdk.Health),
    (server.Readiness, sdk.Readiness),
    (server.ReloadResponse, sdk.ReloadResponse),
    (server.EmbeddingsResponse, sdk.EmbeddingsResponse),
    (server.ModelList, sdk.ModelList),
    (server.ModelCard, sdk.ModelCard),
    (server.ClusterResponse, sdk.ClusterResponse),
    (server.OperatingPointsOut, sdk.OperatingPoints),
    (server.ExperimentsOut, sdk.Experiments),
    (server.AssignmentOut, sdk.Assignment),
    (server.UpsertResponse, sdk.UpsertResponse),
    (server.DeleteResponse, sdk.DeleteResponse),
]

Schema = dict[str, Any]


def _resolve(schema: Schema, defs: Schema) -> Schema:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _alternatives(schema: Schema) -> list[Schema]:
    return list(schema.get("anyOf", [schema]))


def check_accepts(sdk_s: Schema, sdk_defs: Schema, srv_s: Schema, srv_defs: Schema, where: str) -> None:
    """Raise AssertionError naming ``where`` unless every value of ``srv_s`` validates as ``sdk_s``."""
    sdk_s, srv_s = _resolve(sdk_s, sdk_defs), _resolve(srv_s, srv_defs)
    for srv_alt in _alternatives(srv_s):
        srv_one = _resolve(srv_alt, srv_defs)
        errors = []
        for sdk_alt in _alternatives(sdk_s):
            try:
                _check_one(_resolve(sdk_alt, sdk_defs), sdk_defs, srv_one, srv_defs, where)
                break
            except AssertionError as exc:
                errors.append(str(exc).splitlines()[0])
        else:
            raise AssertionError(" / ".join(errors))


def _check_one(sdk_s: Schema, sdk_defs: Schema, srv_s: Schema, srv_defs: Schema, where: str) -> None:
    srv_type, sdk_type = srv_s.get("type"), sdk_s.get("type")
    if srv_type == "integer" and sdk_type == "number":
        return
    assert sdk_type == srv_type, f"{where}: type {sdk_type!r}, the server's is {srv_type!r}"
    if srv_type == "array":
        check_accepts(sdk_s["items"], sdk_defs, srv_s["items"], srv_defs, f"{where}[]")
    if srv_type == "object" and "properties" in srv_s:
        sdk_props = sdk_s.get("properties", {})
        for name, prop in srv_s["properties"].items():
            assert name in sdk_props, f"{where}.{name}: missing from the SDK's model"
            check_accepts(sdk_props[name], sdk_defs, prop, srv_defs, f"{where}.{name}")
        extra = set(sdk_s.get("required", [])) - set(srv_s.get("required", []))
        assert not extra, f"{where}: the SDK requires {sorted(extra)}, which the server may leave out"
    elif srv_type == "object" and isinstance(srv_s.get("additionalProperties"), dict):
        check_accepts(
            sdk_s.get("additionalProperties", {}),
            sdk_defs,
            srv_s["additionalProperties"],
            srv_defs,
            f"{where}{{}}",
        )


def check_covers(server_model: type[BaseModel], sdk_model: type[BaseModel]) -> None:
    srv = server_model.model_json_schema(mode="serialization")
    ours = sdk_model.model_json_schema(mode="validation")
    check_accepts(ours, ours.get("$defs", {}), srv, srv.get("$defs", {}), server_model.__name__)


@pytest.mark.parametrize(("server_model", "sdk_model"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_sdk_model_covers_the_server_schema(
    server_model: type[BaseModel], sdk_model: type[BaseModel]
) -> None:
    check_covers(server_model, sdk_model)


def test_the_check_catches_drift() -> None:
    class NoReason(BaseModel):
        status: str
        bundle_version: str | None = None
        backend: str | None = None
        num_docs: int | None = None

    with pytest.raises(AssertionError, match=r"Readiness\.reason: missing"):
        check_covers(server.Readiness, NoReason)

    class TextCount(NoReason):
        reason: str | None = None
        num_docs: str | None = None  # type: ignore[assignment]

    with pytest.raises(
        AssertionError, match=r"Readiness\.num_docs: type 'string', the server's is 'integer'"
    ):
        check_covers(server.Readiness, TextCount)

    class BackendRequired(sdk.Readiness):
        backend: str

    with pytest.raises(AssertionError, match=r"Readiness\.backend: type 'string', the server's is 'null'"):
        check_covers(server.Readiness, BackendRequired)

    class HealthWithId(sdk.Health):
        id: str

    with pytest.raises(AssertionError, match=r"Health: the SDK requires \['id'\]"):
        check_covers(server.Health, HealthWithId)


def test_a_server_answer_validates_and_unknown_fields_are_kept() -> None:
    answer = server.SearchResponse(
        results=[server.QueryResult(hits=[server.Hit(id="d1", score=1.0, subspace_scores={"a": 1.0})])],
        weights_used={"a": 1.0},
        bundle_version="v1",
        backend="numpy",
    ).model_dump_json()
    newer = answer[:-1] + ',"served_by":"replica-7"}'
    res = sdk.SearchResponse.model_validate_json(newer)
    assert res.results[0].hits[0].id == "d1"
    assert res.model_extra == {"served_by": "replica-7"}
