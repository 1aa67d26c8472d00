"""Generate ``docs/settings.md``: every ``ESP_*`` setting the service reads, from its one source.

The rows are the fields of :class:`esp_retrieval.service.config.Settings` (``ESP_*``) and
:class:`esp_retrieval.service.engine.milvus_backend.MilvusSettings` (``ESP_MILVUS_*``): the variable, its
default, what it accepts (type and bounds, read from the field's constraints), its description,
and where the Helm chart sets it (:data:`HELM`). ``python -m deploy.settings_doc`` writes the
file, ``--check`` exits 1 when the committed one drifts; ``tests/deploy/test_settings_doc.py``
checks that, that every setting has a :data:`HELM` entry, and that the chart renders each one
into the pod's environment.
"""

from __future__ import annotations

import tempfile
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from deploy.files import REPO_ROOT, generator_main
from esp_retrieval.service.config import Settings
from esp_retrieval.service.engine.milvus_backend import MilvusSettings

DOC = Path("docs") / "settings.md"

#: settings classes and their environment prefix, in table order
SOURCES: tuple[tuple[type[BaseModel], str], ...] = ((Settings, "ESP_"), (MilvusSettings, "ESP_MILVUS_"))


@dataclass(frozen=True)
class Value:
    """A setting the chart takes from a value (``path``, dotted) into the pod's environment.

    ``example``: a value the chart's schema accepts, which the test renders; ``expect``: what
    the variable then holds when that is not the example itself; ``env``: the variable the chart
    sets when it is another one (an alias the settings read, e.g. a URI in ``ESP_BUNDLE``);
    ``needs``: other values (dotted) it is rendered under, ``when`` says so in the table;
    ``secret``: read from the Secret the value names (``valueFrom.secretKeyRef``), never
    written into a ConfigMap.
    """

    path: str
    example: Any
    expect: str | None = None
    env: str | None = None
    needs: Mapping[str, Any] = field(default_factory=dict)
    when: str = ""
    secret: bool = False

    def shown(self) -> str:
        where = f"`{self.path}`" + (" (the Secret's name)" if self.secret else "")
        where += f" ({self.when})" if self.when else ""
        return where + (f", as `{self.env}`" if self.env else "")


@dataclass(frozen=True)
class Fixed:
    """A setting the chart sets to one value (``value``), for the reason given."""

    value: str
    why: str

    def shown(self) -> str:
        return f"fixed `{self.value}`: {self.why}"


@dataclass(frozen=True)
class NotServed:
    """A setting the server never reads (another command does); the chart has no value for it."""

    why: str

    def shown(self) -> str:
        return f"none: {self.why}"


_REMOTE = {
    "bundle.source": "remote",
    "bundle.remote.uri": "https://models.example/b1",
    "bundle.remote.sha256": "a" * 64,
}
_WHEN_REMOTE = "`bundle.source: remote`"
_MILVUS = {"milvus.enabled": True, "milvus.uri": "http://milvus.example:19530"}
_WHEN_MILVUS = "`milvus.enabled`"
_LOAD_ONLY = NotServed("read by `esp milvus-load` when it writes the collection")

#: environment variable -> where the Helm chart (helm/esp-retrieval) sets it
HELM: dict[str, Value | Fixed | NotServed] = {
    "ESP_BUNDLE": Value("bundle.path", "/models/other"),
    "ESP_BUNDLE_URI": Value(
        "bundle.remote.uri", "https://models.example/b2", env="ESP_BUNDLE",
        needs={**_REMOTE, "bundle.remote.fetch": "inProcess"},
        when="`bundle.source: remote`, `bundle.remote.fetch: inProcess`",
    ),
    "ESP_BUNDLE_SHA256": Value("bundle.remote.sha256", "b" * 64, needs=_REMOTE, when=_WHEN_REMOTE),
    "ESP_BUNDLE_CACHE": Value(
        "bundle.remote.cache.mountPath", "/var/cache/other", needs=_REMOTE, when=_WHEN_REMOTE
    ),
    "ESP_REGISTRY": Value("registry.mountPath", "/etc/esp/other", expect="/etc/esp/other/registry.yaml"),
    "ESP_REGISTRY_POLL_SECONDS": Value("config.registryPollSeconds", 7.5),
    "ESP_ADMIN_TOKEN": Value("adminToken.existingSecret", "admin-secret", secret=True),
    "ESP_HOST": Fixed("0.0.0.0", "the pod listens on every interface"),
    "ESP_PORT": Value("containerPort", 8123),
    "ESP_BACKEND": Value("config.backend", "ivf"),
    "ESP_PRECISION": Value("config.precision", "float16"),
    "ESP_THREADS": Value("config.threads", 3),
    "ESP_BLOCKING_THREADS": Value("config.blockingThreads", 6),
    "ESP_ANN_MAX_TOUCHED": Value("config.annMaxTouched", 0.25),
    "ESP_ENCODER_DEVICE": Value("config.encoderDevice", "cpu"),
    "ESP_MAX_QUERIES": Value("config.maxQueries", 17),
    "ESP_MAX_EMBEDDING_INPUTS": Value("config.maxEmbeddingInputs", 99),
    "ESP_MAX_EMBEDDING_TOKENS": Value("config.maxEmbeddingTokens", 123456789),
    "ESP_MAX_EMBEDDING_QUEUE": Value("config.maxEmbeddingQueue", 3),
    "ESP_EMBEDDING_DEADLINE_SECONDS": Value("config.embeddingDeadlineSeconds", 7.5),
    "ESP_MAX_K": Value("config.maxK", 77),
    "ESP_MAX_BODY_BYTES": Value("config.maxBodyBytes", 123456789),
    "ESP_MAX_BATCH": Value("config.maxBatch", 31),
    "ESP_MAX_WAIT_MS": Value("config.maxWaitMs", 1.5),
    "ESP_QUEUE_SIZE": Value("config.queueSize", 4321),
    "ESP_BATCHING": Value("config.batching", False),
    "ESP_MAX_CLUSTER_KEYWORDS": Value("config.maxClusterKeywords", 555),
    "ESP_OTEL": Value("config.otel", True),
    "ESP_MAX_CLUSTER_JOBS": Value("config.maxClusterJobs", 2),
    "ESP_MAX_HITS": Value("config.maxHits", 22222),
    "ESP_MAX_RESPONSE_BYTES": Value("config.maxResponseBytes", 987654321),
    "ESP_LATENCY_BUDGET_MS": Value("config.latencyBudgetMs", 125.5),
    "ESP_MAX_INFLIGHT_SEARCHES": Value("config.maxInflightSearches", 12),
    "ESP_MAX_CLUSTER_TOKENS": Value("config.maxClusterTokens", 30303),
    "ESP_CLUSTER_TIMEOUT_SECONDS": Value("config.clusterTimeoutSeconds", 12.5),
    "ESP_BUNDLE_PERMISSIONS": Value("config.bundlePermissions", "warn"),
    "ESP_BUNDLE_ROOTS": Value(
        "config.bundleRoots", ["/models", "s3://models/esp/"], expect="/models,s3://models/esp/"
    ),
    "ESP_ALLOW_NO_ENCODER": Value("config.allowNoEncoder", True),
    "ESP_MAX_HEADER_BYTES": Value("config.maxHeaderBytes", 32768),
    "ESP_MAX_HEADERS": Value("config.maxHeaders", 64),
    "ESP_HEADER_TIMEOUT_SECONDS": Value("config.headerTimeoutSeconds", 4.5),
    "ESP_BODY_TIMEOUT_SECONDS": Value("config.bodyTimeoutSeconds", 8.5),
    "ESP_SEARCH_BODY_DEADLINE_SECONDS": Value("config.searchBodyDeadlineSeconds", 6.5),
    "ESP_KEEP_ALIVE_SECONDS": Value("config.keepAliveSeconds", 3.5),
    "ESP_MAX_CONNECTIONS": Value("config.maxConnections", 2048),
    "ESP_LINGER_SECONDS": Value("config.lingerSeconds", 0.5),
    "ESP_LOG_FORMAT": Value("config.logFormat", "text"),
    "ESP_EXPOSURE_LOG": Value("exposureLog.mode", "stdout"),
    "ESP_EXPOSURE_LOG_PATH": Value(
        "exposureLog.path", "/var/log/esp/e.jsonl", needs={"exposureLog.mode": "file"},
        when="`exposureLog.mode: file`",
    ),
    "ESP_EXPOSURE_LOG_MAX_BYTES": Value("exposureLog.maxBytes", 2147483648),
    "ESP_EXPOSURE_LOG_BACKUPS": Value("exposureLog.backups", 9),
    "ESP_EXPOSURE_SAMPLE_RATE": Value("exposureLog.sampleRate", 0.25),
    "ESP_EXPOSURE_HASH_UNIT_ID": Value("exposureLog.hashUnitId", False),
    "ESP_EXPOSURE_SALT": Value("exposureLog.saltSecret", "salt-secret", secret=True),
    "ESP_EXPOSURE_SALT_FILE": Value("exposureLog.saltFile", "/var/lib/esp/salt"),
    "ESP_EXPOSURE_INCLUDE_IDS": Value("exposureLog.includeIds", True),
    "ESP_TRACING": Value("tracing.enabled", True),
    "ESP_OTLP_ENDPOINT": Value("tracing.otlpEndpoint", "http://otel.example:4318/v1/traces"),
    "ESP_TRACE_SAMPLE_RATIO": Value("tracing.sampleRatio", 0.125),
    "ESP_MILVUS_URI": Value(
        "milvus.uri", "http://other.example:19530", needs={"milvus.enabled": True}, when=_WHEN_MILVUS
    ),
    "ESP_MILVUS_TOKEN": Value(
        "milvus.tokenSecret", "milvus-secret", secret=True, needs=_MILVUS, when=_WHEN_MILVUS
    ),
    "ESP_MILVUS_DB_NAME": Value("milvus.dbName", "search", needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_COLLECTION": Value("milvus.collection", "other", needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_INDEX": _LOAD_ONLY,
    "ESP_MILVUS_NLIST": _LOAD_ONLY,
    "ESP_MILVUS_NPROBE": Value("milvus.nprobe", 33, needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_HNSW_M": _LOAD_ONLY,
    "ESP_MILVUS_EF_CONSTRUCTION": _LOAD_ONLY,
    "ESP_MILVUS_EF": Value("milvus.ef", 2048, needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_CANDIDATES": Value("milvus.candidates", 48, needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_TIMEOUT": Value("milvus.timeoutSeconds", 45.5, needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_CONSISTENCY": Value("milvus.consistency", "Bounded", needs=_MILVUS, when=_WHEN_MILVUS),
    "ESP_MILVUS_INDEX_WAIT": _LOAD_ONLY,
}


@dataclass(frozen=True)
class Row:
    env: str
    default: str
    accepts: str
    description: str
    helm: str


def _yaml(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def rendered(value: Any) -> str:
    """A value as the environment holds it (booleans as pydantic reads them back: true/false)."""
    return _yaml(value)


def _default(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None or (isinstance(value, str | SecretStr) and not str(value)):
        return "unset"
    if isinstance(value, Path) and value.is_relative_to(tempfile.gettempdir()):
        return f"`<temp dir>/{value.relative_to(tempfile.gettempdir())}`"
    return f"`{_yaml(value)}`"


_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
           (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"))


def _accepts(info: FieldInfo) -> str:
    kind: Any = info.annotation
    if typing.get_origin(kind) is not typing.Literal:  # X | None: X
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
    if typing.get_origin(kind) is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(kind))
    names: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path",
                             SecretStr: "string (secret)"}
    name = names.get(kind, str(kind))
    bounds = [f"{sign} {getattr(m, attr)}" for m in info.metadata for cls, attr, sign in _BOUNDS
              if isinstance(m, cls)]
    pattern = next((m.pattern for m in info.metadata if getattr(m, "pattern", None)), None)
    if pattern == r"^[0-9a-f]{64}$":
        bounds.append("64 hex digits")
    elif pattern:
        bounds.append(f"matching `{pattern}`")
    return ", ".join([name, *bounds])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rows() -> list[Row]:
    """One row per setting, in the order the classes declare them."""
    out = []
    for cls, prefix in SOURCES:
        for name, info in cls.model_fields.items():
            env = f"{prefix}{name}".upper()
            helm = HELM.get(env)
            out.append(Row(
                env=env,
                default=_default(info),
                accepts=_accepts(info),
                description=_cell(info.description or ""),
                helm=_cell(helm.shown()) if helm is not None else "**missing**",
            ))
    return out


def markdown() -> str:
    lines = [
        "# Settings",
        "",
        "<!-- Generated by `python -m deploy.settings_doc` from esp_retrieval/service/config.py and",
        "     esp_retrieval/service/engine/milvus_backend.py; do not edit. -->",
        "",
        "Every setting the server reads, as an environment variable (and the `ESP_MILVUS_*` ones",
        "only `esp milvus-load` reads, marked so). `esp serve` options set some",
        "of them (`--backend` is `ESP_BACKEND`, ...; `esp serve --help`); in Kubernetes the Helm",
        "chart sets each from the value named in the last column (`helm/esp-retrieval/values.yaml`).",
        "A value the server refuses stops it at start with a message naming the variable.",
        "",
        "| variable | default | accepts | what it does | Helm value |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| `{r.env}` | {r.default} | {r.accepts} | {r.description} | {r.helm} |" for r in rows()]
    return "\n".join(lines) + "\n"


def build() -> dict[str, str]:
    return {DOC.name: markdown()}


def main(argv: list[str] | None = None) -> int:
    return generator_main(
        "deploy.settings_doc", __doc__ or "", REPO_ROOT / DOC.parent, build, DOC.name, argv=argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
