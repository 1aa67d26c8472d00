"""Builders for the strict JSON schemas of custom resources (:mod:`tests.deploy.crd_schemas`,
:mod:`tests.deploy.rayjob_schema`): ``additionalProperties: false`` on every object, so a
misspelt or misplaced field fails here as the operator's CRD validation would refuse or prune it."""

from __future__ import annotations

from typing import Any

STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
#: a Kubernetes object name (DNS label: lower case alphanumerics and '-')
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def strict(properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """An object with exactly ``properties`` allowed, ``required`` among them; ``extra`` keywords
    (``oneOf``, ...) are added as they are."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return {**schema, "properties": properties, **extra}


def metadata(name_max: int) -> dict[str, Any]:
    """``metadata``: a name of at most ``name_max`` characters, namespace, labels, annotations."""
    return strict(
        {
            "name": {"type": "string", "pattern": NAME_PATTERN, "maxLength": name_max},
            "namespace": {"type": "string"},
            "labels": STRING_MAP,
            "annotations": STRING_MAP,
        },
        ("name",),
    )


def resource(api_version: str, kind: str, meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A whole object of ``kind``: apiVersion, kind, metadata and spec, all required."""
    return strict(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": meta, "spec": spec},
        ("apiVersion", "kind", "metadata", "spec"),
    )
