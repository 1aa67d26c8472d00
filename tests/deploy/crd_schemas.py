"""Strict JSON schemas for the two prometheus-operator objects the chart renders.

kubernetes-validate knows only built-in kinds. These schemas cover the subset of the
monitoring.coreos.com/v1 API (ServiceMonitor, PrometheusRule) that the chart may write, with
``additionalProperties: false`` everywhere (:mod:`tests.deploy.k8s_schema`), so a misspelt or misplaced field fails as it would
with the operator's CRD validation. Written from the operator's API reference.
"""

from __future__ import annotations

from typing import Any

from tests.deploy.k8s_schema import STRING_MAP, metadata, resource, strict

# Prometheus duration, as the operator's CRDs define it.
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
METADATA = metadata(253)
RELABEL = strict({
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                        "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                        "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                        "dropequal", "DropEqual"]},
    "modulus": {"type": "integer", "minimum": 1},
    "regex": {"type": "string"},
    "replacement": {"type": "string"},
    "separator": {"type": "string"},
    "sourceLabels": {"type": "array", "items": {"type": "string"}},
    "targetLabel": {"type": "string"},
})
LABEL_SELECTOR = strict({
    "matchLabels": STRING_MAP,
    "matchExpressions": {"type": "array", "items": strict(
        {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
         "values": {"type": "array", "items": {"type": "string"}}},
        ("key", "operator"),
    )},
})


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return resource("monitoring.coreos.com/v1", kind, METADATA, spec)


SERVICE_MONITOR = _object("ServiceMonitor", strict(
    {
        "selector": LABEL_SELECTOR,
        "namespaceSelector": strict(
            {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}
        ),
        "jobLabel": {"type": "string"},
        "endpoints": {"type": "array", "minItems": 1, "items": strict({
            "port": {"type": "string"},
            "targetPort": {"type": ["integer", "string"]},
            "path": {"type": "string", "pattern": "^/"},
            "scheme": {"enum": ["http", "https"]},
            "interval": DURATION,
            "scrapeTimeout": DURATION,
            "honorLabels": {"type": "boolean"},
            "relabelings": {"type": "array", "items": RELABEL},
            "metricRelabelings": {"type": "array", "items": RELABEL},
        })},
    },
    ("selector", "endpoints"),
))

PROMETHEUS_RULE = _object("PrometheusRule", strict(
    {"groups": {"type": "array", "items": strict(
        {
            "name": {"type": "string", "minLength": 1},
            "interval": DURATION,
            "limit": {"type": "integer"},
            "rules": {"type": "array", "items": strict(
                {
                    "alert": {"type": "string"},
                    "record": {"type": "string"},
                    "expr": {"type": ["string", "integer"]},
                    "for": DURATION,
                    "keep_firing_for": DURATION,
                    "labels": STRING_MAP,
                    "annotations": STRING_MAP,
                },
                ("expr",),
                oneOf=[{"required": ["alert"]}, {"required": ["record"]}],
            )},
        },
        ("name", "rules"),
    )}},
    ("groups",),
))

#: (apiVersion, kind) -> schema
SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
