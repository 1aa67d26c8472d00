"""``milvus``: the knob served from a Milvus collection (Milvus Lite file, server or cluster).

The score is one inner product over the concatenated vector (docs/architecture.md section 1),
so the collection needs one vector field (``esp_vector``, metric IP) and the block-scaled query:
no per-field search and no fused ranker. Beside the vector: ``esp_id`` (primary key, the
document id), ``esp_row`` (the bundle row; live documents get ``2**62 + hash(id)``, so the
tie order of bundle rows is the numpy backend's), and per metadata field of the bundle's
``docs.jsonl`` a typed column plus ``esp_has_<field>`` (presence; Milvus Lite has no nullable
fields). The collection's description records the layout, the metadata schema and a
fingerprint of the corpus it was loaded from (:func:`load_bundle`, ``esp milvus-load``).

Search, by the index the collection has:

* ``FLAT`` (exact; ``GPU_BRUTE_FORCE`` on a GPU deployment is the same): Milvus returns the top
  ``c`` by its float32 scores with their vectors; the completeness check of
  :mod:`esp_retrieval.subspace.engine.base` (the ``c``-th score below the ``k``-th by ``2 eps``, else ``4c``)
  and the float64 re-rank of those vectors give exactly the numpy backend's top ``k``.
* ``IVF_FLAT``, ``HNSW``, ``AUTOINDEX`` (approximate): Milvus returns
  ``max(k + max(8, k // 8), candidates)`` candidates (searched with ``nprobe``, or ``ef`` raised
  to at least that many), re-ranked exactly (float64, per-subspace scores); recall against
  ``nprobe`` / ``ef`` / ``candidates`` is measured in ``bench/milvus.py``. On IVF_FLAT more
  candidates do not help (the probed lists are scanned exactly; only ``nprobe`` adds recall).

What hits show (``documents``): the id and metadata fields each candidate of a search comes
with, read with its vector, so the hits of a search are shown as that search read them. They
are cached by row for look-ups, but every search refreshes the rows it reads: with several
replicas over one collection, a document rewritten through one replica is shown with its new
text and vector by every replica at its next search that finds it.

Filters go to Milvus as expressions (:func:`esp_retrieval.subspace.filters.milvus_expression`). Writes
(:meth:`MilvusBackend.upsert`, :meth:`MilvusBackend.delete`) and their id look-ups use
consistency level ``Strong``; searches use ``consistency`` (default ``Strong``: a search sees
every write acknowledged before it started, on a server at the cost of waiting for the next time
tick, about 200 ms; ``Session``: this process's own writes; ``Bounded``: writes older than the
server's graceful time). Settings: ``ESP_MILVUS_*`` (:class:`MilvusSettings`); the backend does
not start without a URI.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import numpy as np
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from esp_retrieval.service.errors import NotReadyError
from esp_retrieval.subspace.engine.base import (
    Backend,
    BackendUnavailable,
    Capabilities,
    EngineInputError,
    LiveDocument,
)
from esp_retrieval.subspace.engine.refine import Batch, Candidates, Filter, RowTable, scan_bound, stack_rows
from esp_retrieval.subspace.engine.sparse_terms import SparseScan
from esp_retrieval.subspace.filters import (
    CompiledFilter,
    FieldType,
    MetadataSchema,
    allowed_rows_expression,
    coerce_value,
    format_date,
    presence_field,
    quote,
)
from esp_retrieval.subspace.layout import SubspaceLayout

log = logging.getLogger(__name__)

ID, ROW, VECTOR = "esp_id", "esp_row", "esp_vector"
LIVE_ROW0 = 1 << 62  # rows of documents written live: LIVE_ROW0 + 62-bit hash of the id
MAX_TOPK = 16384  # Milvus' largest limit per search
MAX_ID_BYTES = 65535
EXACT_INDEXES = ("FLAT", "GPU_BRUTE_FORCE")
INDEXES = ("FLAT", "IVF_FLAT", "HNSW", "AUTOINDEX", "GPU_BRUTE_FORCE")
CONSISTENCY: Final = "Strong"
FORMAT = 1
_DOC_CACHE_MAX = 1 << 20


class MilvusSettings(BaseSettings):
    """Where the collection is and how to search it (environment ``ESP_MILVUS_*``)."""

    model_config = SettingsConfigDict(env_prefix="ESP_MILVUS_", extra="ignore")

    uri: str | None = Field(
        None, description="a Milvus Lite file (path ending in .db) or a server URI (http://host:19530)"
    )
    token: SecretStr | None = Field(None, description="server token ('user:password' or an API key)")
    db_name: str = Field("", description="database on the server (default database when empty)")
    collection: str = Field("esp", description="collection name")
    index: str = Field("FLAT", description=f"index written by esp milvus-load: {', '.join(INDEXES)}")
    nlist: int = Field(1024, ge=1, description="IVF_FLAT lists")
    nprobe: int = Field(64, ge=1, description="IVF_FLAT lists probed per query")
    hnsw_m: int = Field(16, ge=2, description="HNSW graph degree")
    ef_construction: int = Field(200, ge=1, description="HNSW build breadth")
    # defaults from bench/milvus.py on a Milvus 2.3.5 server (100k x 384): HNSW recall@10 follows
    # ef, not the candidates (those only add transfer); ef 1024 gave >= 0.925 at every weight vector
    ef: int = Field(1024, ge=1, description="HNSW search breadth (at least the candidates fetched)")
    candidates: int = Field(
        32, ge=1, description="approximate indexes: candidates re-ranked exactly (at least k + max(8, k/8))"
    )
    timeout: float = Field(60.0, gt=0, description="seconds per Milvus call")
    consistency: Literal["Strong", "Session", "Bounded", "Eventually"] = Field(
        CONSISTENCY, description="consistency level of searches (writes and their look-ups: Strong)"
    )
    index_wait: float = Field(
        3600.0, gt=0, description="seconds esp milvus-load waits for a server's background index build"
    )


def connect(settings: MilvusSettings) -> Any:
    """A ``pymilvus.MilvusClient`` for the settings' URI (Milvus Lite for a local ``.db`` path)."""
    try:
        from pymilvus import MilvusClient
    except ImportError as exc:
        raise BackendUnavailable(
            "milvus: pymilvus is not installed (pip install pymilvus milvus-lite)"
        ) from exc
    if not settings.uri:
        raise BackendUnavailable("milvus: no URI configured (set ESP_MILVUS_URI to a .db file or a server)")
    token = settings.token.get_secret_value() if settings.token is not None else ""
    try:
        # an alias of its own: pymilvus shares one connection per URI, and closing a client closes
        # it for all (a retired engine must not close the connection of the one that replaced it)
        alias = f"esp-{uuid.uuid4().hex}"
        return MilvusClient(
            uri=settings.uri, token=token, db_name=settings.db_name, timeout=settings.timeout, alias=alias
        )
    except Exception as exc:  # pymilvus raises its own exception types for every connection failure
        raise BackendUnavailable(f"milvus: cannot connect to {settings.uri!r}: {exc}") from exc


def fingerprint(corpus: np.ndarray) -> str:
    """A cheap identity of a corpus: its shape and dtype and 64 rows spread over it."""
    n = corpus.shape[0]
    h = hashlib.sha256(f"{corpus.shape}:{corpus.dtype}".encode())
    for i in np.unique(np.linspace(0, n - 1, min(n, 64)).astype(np.int64)):
        h.update(np.ascontiguousarray(corpus[int(i)]).tobytes())
    return h.hexdigest()[:16]


def live_row(doc_id: str) -> int:
    """The row of a document written live (not from the bundle)."""
    return LIVE_ROW0 + (int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big") >> 2)


_MILVUS_TYPES: dict[FieldType, str] = {
    FieldType.STRING: "VARCHAR",
    FieldType.TEXT: "VARCHAR",  # stored and returned, never in an expression (esp_retrieval.subspace.filters)
    FieldType.INT: "INT64",
    FieldType.FLOAT: "DOUBLE",
    FieldType.BOOL: "BOOL",
    FieldType.DATE: "INT64",
}


def _index_params(settings: MilvusSettings, index: str) -> dict[str, Any]:
    if index == "IVF_FLAT":
        return {"nlist": settings.nlist}
    if index == "HNSW":
        return {"M": settings.hnsw_m, "efConstruction": settings.ef_construction}
    return {}


def create_collection(
    client: Any,
    settings: MilvusSettings,
    layout: SubspaceLayout,
    schema: MetadataSchema,
    description: Mapping[str, Any],
) -> None:
    """The collection of one bundle: id, row, the vector, a typed column + presence flag per field."""
    from pymilvus import DataType, MilvusClient

    index = settings.index.upper()
    if index not in INDEXES:
        raise EngineInputError(
            f"milvus index {settings.index!r} is unknown; allowed: {list(INDEXES)}", "index"
        )
    s = MilvusClient.create_schema(
        auto_id=False, enable_dynamic_field=False, description=json.dumps(description)
    )
    s.add_field(ID, DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES)
    s.add_field(ROW, DataType.INT64)
    s.add_field(VECTOR, DataType.FLOAT_VECTOR, dim=layout.dim)
    for name, kind in schema.fields.items():
        dtype = getattr(DataType, _MILVUS_TYPES[kind])
        extra = {"max_length": 65535} if kind in (FieldType.STRING, FieldType.TEXT) else {}
        s.add_field(name, dtype, **extra)
        s.add_field(presence_field(name), DataType.BOOL)
    params = client.prepare_index_params()
    params.add_index(
        field_name=VECTOR, index_type=index, metric_type="IP", params=_index_params(settings, index)
    )
    client.create_collection(
        settings.collection,
        schema=s,
        index_params=params,
        consistency_level=CONSISTENCY,
        timeout=settings.timeout,
    )

def _columns(metadata: Any) -> dict[str, str]:
    """A description's metadata fields as columns: ``text`` and ``string`` are both VARCHAR (a
    collection written before ``text`` was a type of its own says ``string``; it is resumed, not
    refused, and keeps what its description says)."""
    fields = metadata if isinstance(metadata, Mapping) else {}
    return {k: FieldType.STRING.value if v == FieldType.TEXT else v for k, v in fields.items()}


#: What a column holds for a document without the field (its presence flag says so).
_ABSENT: dict[FieldType, Any] = {
    FieldType.STRING: "", FieldType.TEXT: "", FieldType.FLOAT: 0.0, FieldType.BOOL: False
}


def _stored(kind: FieldType, value: Any, where: str) -> tuple[Any, bool]:
    """A metadata value as its column stores it, and whether it is present (a placeholder if not)."""
    if value is None:
        return _ABSENT.get(kind, 0), False
    return coerce_value(kind, value, where), True


def _check_id(doc_id: Any, where: str) -> None:
    if not isinstance(doc_id, str) or not doc_id or len(doc_id.encode()) > MAX_ID_BYTES:
        raise EngineInputError(
            f"{where}.id must be a non-empty string of at most {MAX_ID_BYTES} bytes", f"{where}.id"
        )


def entity(
    doc_id: str,
    row: int,
    vector: np.ndarray,
    fields: Mapping[str, Any],
    *,
    schema: MetadataSchema,
    where: str,
) -> dict[str, Any]:
    """One row of the collection. ``fields``: values as in docs.jsonl (checked against the schema)."""
    _check_id(doc_id, where)
    out: dict[str, Any] = {ID: doc_id, ROW: int(row), VECTOR: np.asarray(vector, np.float32).tolist()}
    for name, kind in schema.fields.items():
        out[name], out[presence_field(name)] = _stored(kind, fields.get(name), f"{where}.{name}")
    return out


#: bytes of vectors per insert request of a load. Milvus Lite's insert costs grow faster than the
#: request (at 1,440 dimensions: ~4,000 rows/s at 250 rows a request, ~200 at 2,000), and a
#: server takes 1 MiB requests at full speed: ``bench/milvus.py --load-baseline`` measures it
REQUEST_BYTES = 1 << 20
#: insert requests of a load in flight at once: the next one is packed while the server writes one
IN_FLIGHT = 2

_SCALAR_COLUMNS: dict[FieldType, tuple[str, str]] = {  # metadata type -> (Milvus type, proto array)
    FieldType.STRING: ("VARCHAR", "string_data"),
    FieldType.TEXT: ("VARCHAR", "string_data"),
    FieldType.INT: ("INT64", "long_data"),
    FieldType.FLOAT: ("DOUBLE", "double_data"),
    FieldType.BOOL: ("BOOL", "bool_data"),
    FieldType.DATE: ("INT64", "long_data"),
}


def batch_rows(dim: int) -> int:
    """Rows per insert request of a load: :data:`REQUEST_BYTES` of float32 vectors."""
    return max(1, REQUEST_BYTES // (4 * dim))


def _packed_floats(vectors: np.ndarray) -> bytes:
    """``vectors`` as the serialised ``FloatArray`` message of Milvus' proto: its one field
    (``repeated float data = 1``, packed) is a tag, a varint length and little-endian float32s."""
    raw = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    n, length = len(raw), bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        length.append(low | (0x80 if n else 0))
        if not n:
            return b"\x0a" + bytes(length) + raw


def insert_request(
    collection: str,
    ids: Sequence[str],
    first_row: int,
    vectors: np.ndarray,
    docs: Sequence[Mapping[str, Any]] | None,
    *,
    schema: MetadataSchema,
) -> Any:
    """One column-wise ``InsertRequest`` of bundle rows ``first_row ...``: what pymilvus would
    build from per-row dicts, but the vectors go in as one block of bytes (pymilvus copies a row
    dict's vector into the message float by float, about 80 us a row at 1,440 dimensions)."""
    from pymilvus import DataType
    from pymilvus.grpc_gen import milvus_pb2

    m = len(ids)
    req = milvus_pb2.InsertRequest(collection_name=collection, num_rows=m)

    def column(name: str, dtype: str) -> Any:
        return req.fields_data.add(type=int(getattr(DataType, dtype)), field_name=name)

    for j, doc_id in enumerate(ids):
        _check_id(doc_id, f"docs[{first_row + j}]")
    column(ID, "VARCHAR").scalars.string_data.data.extend(ids)
    column(ROW, "INT64").scalars.long_data.data.extend(range(first_row, first_row + m))
    vec = column(VECTOR, "FLOAT_VECTOR").vectors
    vec.dim = vectors.shape[1]
    vec.float_vector.MergeFromString(_packed_floats(vectors))
    for name, kind in schema.fields.items():
        values, present = [], []
        for j in range(m):
            value = docs[first_row + j].get(name) if docs is not None else None
            stored, has = _stored(kind, value, f"docs[{first_row + j}].{name}")
            values.append(stored)
            present.append(has)
        dtype, array = _SCALAR_COLUMNS[kind]
        getattr(column(name, dtype).scalars, array).data.extend(values)
        column(presence_field(name), "BOOL").scalars.bool_data.data.extend(present)
    return req


def read_description(client: Any, collection: str, timeout: float) -> dict[str, Any]:
    desc = client.describe_collection(collection, timeout=timeout)
    try:
        meta = json.loads(desc.get("description") or "{}")
    except json.JSONDecodeError:
        meta = {}
    if not isinstance(meta, dict) or meta.get("esp") != FORMAT:
        raise BackendUnavailable(f"milvus: collection {collection!r} was not written by esp milvus-load")
    return meta


def count_rows(client: Any, collection: str, timeout: float, expr: str = "") -> int:
    res = client.query(collection, filter=expr, output_fields=["count(*)"], timeout=timeout)
    return int(res[0]["count(*)"])


@dataclass(frozen=True)
class LoadReport:
    collection: str
    rows: int
    skipped: int
    index: str
    seconds: float
    #: of ``seconds``: sending the rows, then the flush and the index build
    write_seconds: float = 0.0
    index_seconds: float = 0.0
    batch: int = 0


def first_missing_row(client: Any, collection: str, n: int, timeout: float) -> int:
    """The first bundle row ``< n`` not in the collection (``n``: every one is there), by
    bisection over counts: rows ``< x`` are all present exactly when ``x`` of them are."""
    lo, hi = 0, n  # rows < lo are all present; some row < hi is missing
    # a new or a complete collection takes one count (on a server each waits for a time tick)
    present = count_rows(client, collection, timeout, f"{ROW} < {n}")
    if present in (0, n):
        return present
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_rows(client, collection, timeout, f"{ROW} < {mid}") == mid:
            lo = mid
        else:
            hi = mid
    return lo


def send_insert(client: Any, request: Any, timeout: float) -> Any:
    """Send an :func:`insert_request` through pymilvus' column-wise insert (its ``insert_param``,
    with its retries and status checks); a future whose ``result()`` raises what the insert did."""
    conn = client._get_connection()  # the MilvusClient's handler: column inserts are not on its surface
    return conn.batch_insert(request.collection_name, [], timeout=timeout, insert_param=request, _async=True)


def load_bundle(
    settings: MilvusSettings,
    layout: SubspaceLayout,
    embeddings: np.ndarray,
    ids: Sequence[str],
    docs: Sequence[Mapping[str, Any]] | None,
    *,
    schema: MetadataSchema,
    bundle_version: str = "",
    batch: int | None = None,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> LoadReport:
    """Write a corpus into the collection, resumably.

    Rows go in order, ``batch`` a request (default :func:`batch_rows`: 1 MiB of vectors),
    :data:`IN_FLIGHT` requests at once, each a column-wise insert (:func:`insert_request`). A
    rerun starts at the first bundle row missing (:func:`first_missing_row`) and first deletes
    the bundle rows past it (requests complete out of order, so an interrupted load may have
    written some), so no row is written twice. Documents written live (rows from
    :data:`LIVE_ROW0`) are left alone. A collection of another corpus is refused unless
    ``replace`` (then dropped and rewritten).
    """
    import time

    t0 = time.perf_counter()
    client = connect(settings)
    name, timeout = settings.collection, settings.timeout
    n = embeddings.shape[0]
    batch = batch or batch_rows(layout.dim)
    desc = {
        "esp": FORMAT,
        "layout": layout.to_dict(),
        "metadata": schema.to_dict(),
        "fingerprint": fingerprint(embeddings),
        "bundle_version": bundle_version,
        "count": n,
    }
    try:
        if client.has_collection(name, timeout=timeout):
            try:
                old = read_description(client, name, timeout)
            except BackendUnavailable:
                old = {}
            same = all(old.get(k) == desc[k] for k in ("layout", "fingerprint", "count"))
            same = same and _columns(old.get("metadata")) == _columns(desc["metadata"])
            if not same:
                if not replace:
                    raise EngineInputError(
                        f"collection {name!r} holds another corpus (bundle {old.get('bundle_version')!r}); "
                        "pass --replace to drop it, or choose another --collection",
                        "collection",
                    )
                client.drop_collection(name, timeout=timeout)
        if not client.has_collection(name, timeout=timeout):
            create_collection(client, settings, layout, schema, desc)
        client.load_collection(name, timeout=timeout)
        start = first_missing_row(client, name, n, timeout)
        if start < n and count_rows(client, name, timeout, f"{ROW} >= {start} and {ROW} < {n}"):
            client.delete(name, filter=f"{ROW} >= {start} and {ROW} < {n}", timeout=timeout)
        if progress is not None:
            progress(start, n)
        pending: list[tuple[int, Any]] = []
        tw = time.perf_counter()
        try:
            for s in range(start, n, batch):
                e = min(n, s + batch)
                request = insert_request(name, ids[s:e], s, embeddings[s:e], docs, schema=schema)
                pending.append((e, send_insert(client, request, timeout)))
                if len(pending) >= IN_FLIGHT:
                    done, future = pending.pop(0)
                    future.result()
                    if progress is not None:
                        progress(done, n)
            while pending:
                done, future = pending.pop(0)
                future.result()
                if progress is not None:
                    progress(done, n)
        finally:
            for _, future in pending:  # an interrupted load: what was sent lands before the close
                try:
                    future.result()
                except Exception:  # its rows are missing, and the rerun writes them
                    log.debug("milvus-load: an insert in flight failed", exc_info=True)
        t1 = time.perf_counter()
        client.flush(name, timeout=timeout)
        wait_for_index(client, name, settings.index_wait)
        index = _index_type(client, name, timeout)
        t2 = time.perf_counter()
        return LoadReport(name, n, start, index, t2 - t0, t1 - tw, t2 - t1, batch)
    finally:
        client.close()


def wait_for_index(client: Any, collection: str, wait: float, poll: float = 0.5) -> dict[str, Any]:
    """Block until the vector index covers every flushed row; the index's description.

    A Milvus server builds the index of a flushed segment in the background, and until it is built
    searches of that segment do not use it (so nprobe / ef mean nothing yet); Milvus Lite builds it
    in the call. :class:`BackendUnavailable` when ``wait`` seconds pass first.
    """
    import time

    deadline = time.monotonic() + wait
    while True:
        info = dict(client.describe_index(collection, VECTOR, timeout=max(1.0, min(60.0, wait))))
        pending = int(info.get("pending_index_rows", 0) or 0)
        if pending == 0 and int(info.get("indexed_rows", 0) or 0) >= int(info.get("total_rows", 0) or 0):
            return info
        if time.monotonic() >= deadline:
            raise BackendUnavailable(
                f"milvus: the index of {collection!r} is not built after {wait:.0f} s "
                f"({info.get('indexed_rows')} of {info.get('total_rows')} rows)"
            )
        time.sleep(poll)


def _index_type(client: Any, collection: str, timeout: float) -> str:
    info = client.describe_index(collection, VECTOR, timeout=timeout)
    return str(info.get("index_type", "FLAT")).upper()


class MilvusBackend(Backend):
    """The engine contract over a Milvus collection; writable (upsert, delete)."""

    name: ClassVar[str] = "milvus"
    precisions: ClassVar[tuple[str, ...]] = ("float32",)
    # a CompiledFilter as ``allowed`` (an expression), the collection's documents and schema,
    # POST/DELETE /v1/documents, and approximate indexes (IVF_FLAT, HNSW, AUTOINDEX)
    capabilities: ClassVar[Capabilities] = Capabilities(
        native_filters=True, metadata=True, writes=True, approximate=True
    )
    metadata_schema: MetadataSchema  # the collection's, set when it is opened

    def __init__(
        self,
        corpus: np.ndarray,
        layout: SubspaceLayout,
        *,
        settings: MilvusSettings | None = None,
        **common: Any,
    ) -> None:
        """``common``: the :class:`Backend` settings (``precision``, ``threads``, ``chunk_rows``)."""
        self.settings = settings if settings is not None else MilvusSettings()
        super().__init__(corpus, layout, **common)

    # --- start ------------------------------------------------------------------------------
    def _require(self) -> None:
        try:
            import pymilvus  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailable(
                "milvus: pymilvus is not installed (pip install pymilvus milvus-lite)"
            ) from exc
        if not self.settings.uri:
            raise BackendUnavailable(
                "milvus: no URI configured (set ESP_MILVUS_URI to a .db file or a server)"
            )

    def _load(self, corpus: np.ndarray) -> None:
        s = self.settings
        self._client = connect(s)
        self._lock = threading.Lock()
        self._docs: dict[int, tuple[str, dict[str, Any]]] = {}
        try:
            if not self._client.has_collection(s.collection, timeout=s.timeout):
                raise BackendUnavailable(
                    f"milvus: collection {s.collection!r} does not exist at {s.uri!r}; "
                    "write the bundle into it first: esp milvus-load BUNDLE --uri ... --collection ..."
                )
            meta = read_description(self._client, s.collection, s.timeout)
            if meta.get("layout") != self.layout.to_dict():
                raise BackendUnavailable(
                    f"milvus: collection {s.collection!r} has another layout than the bundle "
                    f"({meta.get('layout')} vs {self.layout.to_dict()})"
                )
            if meta.get("fingerprint") != fingerprint(corpus):
                raise BackendUnavailable(
                    f"milvus: collection {s.collection!r} was loaded from another corpus (bundle "
                    f"{meta.get('bundle_version')!r}); run esp milvus-load for this bundle"
                )
            self.metadata_schema = MetadataSchema.from_dict(meta.get("metadata") or {})
            self.index_type = _index_type(self._client, s.collection, s.timeout)
            self._client.load_collection(s.collection, timeout=s.timeout)
        except BackendUnavailable:
            self._client.close()
            raise
        except Exception as exc:
            self._client.close()
            raise BackendUnavailable(f"milvus: {exc}") from exc
        self._fields = dict(self.metadata_schema.fields)
        #: what a search reads of each candidate: id, row, metadata (the display fields among
        #: them) and presence flags, and the vector the re-rank scores (last)
        self._hit_fields = [ID, ROW, *self._fields, *(presence_field(f) for f in self._fields), VECTOR]
        # stored vectors: block-normalised float32; live writes are normalised the same way
        self._max_block_norm = np.maximum(self._max_block_norm, 1.0 + 1e-5)

    @property
    def exact(self) -> bool:
        return self.index_type in EXACT_INDEXES

    def close(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            self._client = None
            try:
                client.close()
            except Exception:  # closing must never fail
                log.exception("milvus: closing the client failed")

    # --- search: the refine loop of Backend, its candidates from Milvus ----------------------------
    def _filter(self, allowed: Any) -> Filter:
        """An expression Milvus evaluates: a :class:`~esp_retrieval.subspace.filters.CompiledFilter`'s, or
        ``esp_row in [...]`` for an ``(N,)`` row mask over the bundle's rows. How many rows it
        allows is not known here, so a query with fewer matches than ``k`` gets its hits padded
        with row ``-1`` (:meth:`Backend.search`)."""
        if allowed is None:
            return Filter(None, arg="")
        if isinstance(allowed, CompiledFilter):
            return Filter(None, arg=allowed.expression())
        return Filter(None, arg=allowed_rows_expression(self._check_allowed(allowed), ROW))

    def search_params(self, limit: int) -> dict[str, Any]:
        """What Milvus is asked to search with for ``limit`` hits: nprobe (IVF_FLAT), ef (HNSW)."""
        s, index = self.settings, self.index_type
        params: dict[str, Any] = {}
        if index == "IVF_FLAT":
            params = {"nprobe": s.nprobe}
        elif index == "HNSW":
            params = {"ef": max(s.ef, limit)}
        return {"metric_type": "IP", "params": params}

    def _milvus_search(self, scaled: np.ndarray, limit: int, expr: str) -> list[Any]:
        client = self._client
        if client is None:
            raise BackendUnavailable("milvus: the engine is closed")
        try:
            return list(
                client.search(
                    self.settings.collection,
                    data=[row.tolist() for row in scaled],
                    anns_field=VECTOR,
                    limit=limit,
                    filter=expr,
                    output_fields=self._hit_fields,
                    search_params=self.search_params(limit),
                    consistency_level=self.settings.consistency,
                    timeout=self.settings.timeout,
                )
            )
        except Exception as exc:
            raise NotReadyError(f"milvus: search failed: {exc}", retry_after=1.0) from exc

    def candidates(self, k: int) -> int:
        if self.exact:
            return super().candidates(k)
        return min(MAX_TOPK, max(k + max(8, k // 8), self.settings.candidates))

    def _scan(
        self, scaled: np.ndarray, c: int, sparse: SparseScan | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        cand = self._fetch_candidates(scaled, c, "")
        return cand.rows, cand.scores

    def _fetch_candidates(self, scaled: np.ndarray, c: int, expr: str) -> Candidates:
        """Milvus' top ``c`` by its float32 scores, with the vectors the re-rank reads."""
        found = self._milvus_search(scaled, c, expr)
        self._remember(h["entity"] for hits in found for h in hits)
        rows = [np.fromiter((h["entity"][ROW] for h in hits), np.int64, len(hits)) for hits in found]
        dist = [np.fromiter((h["distance"] for h in hits), np.float32, len(hits)) for hits in found]
        r, s = stack_rows(rows, dist)
        vectors = [h["entity"][VECTOR] for hits in found for h in hits]
        table = RowTable(np.concatenate(rows), np.asarray(vectors, np.float64).reshape(-1, self.dim))
        return Candidates(r, s, scan_bound(np, r, s, c), table)

    def _candidates(self, batch: Batch, c: int, flt: Filter) -> Candidates:
        """FLAT: Milvus' top ``c`` (exact scores within the float32 bound, so completed as every
        backend's); approximate indexes: its candidates as they are. Past Milvus' largest limit
        (ties defeat ``MAX_TOPK`` candidates): every matching document."""
        if c > MAX_TOPK:
            rows, vectors = self._exhaustive(flt.arg)
            every = np.broadcast_to(rows, (batch.scan.shape[0], rows.size))
            return Candidates(every, source=RowTable(rows, vectors))
        cand = self._fetch_candidates(batch.scan, c, flt.arg)
        return cand if self.exact else Candidates(cand.rows, source=cand.source)

    def _exhaustive(self, expr: str) -> tuple[np.ndarray, np.ndarray]:
        """Every matching document's row and vector (when ties defeat ``MAX_TOPK`` candidates)."""
        it = self._client.query_iterator(
            self.settings.collection,
            batch_size=4096,
            filter=expr,
            output_fields=self._hit_fields,
            timeout=self.settings.timeout,
        )
        rows: list[int] = []
        vecs: list[list[float]] = []
        try:
            while batch := it.next():
                self._remember(batch)
                rows.extend(int(r[ROW]) for r in batch)
                vecs.extend(r[VECTOR] for r in batch)
        finally:
            it.close()
        return np.asarray(rows, np.int64), np.asarray(vecs, np.float64).reshape(-1, self.dim)

    # --- what hits show -------------------------------------------------------------------------
    def _remember(self, stored: Iterable[Mapping[str, Any]]) -> None:
        """Cache the id and display fields of documents as a search or look-up just read them.

        Every candidate a search reads comes with them (:attr:`_hit_fields`), so the hits of a
        search are shown as that search read them, with their vectors: a document another
        process (another replica) rewrote shows its new text at the first search that returns it.
        """
        with self._lock:
            got = list(stored)
            if len(self._docs) + len(got) > _DOC_CACHE_MAX:
                self._docs.clear()
            for r in got:
                self._docs[int(r[ROW])] = (str(r[ID]), self._as_docs(r))

    def _query(self, expr: str, fields: Sequence[str], consistency: str = CONSISTENCY) -> list[Any]:
        """The ``fields`` of the documents matching ``expr`` (writes and their look-ups: Strong)."""
        return list(
            self._client.query(
                self.settings.collection,
                filter=expr,
                output_fields=list(fields),
                consistency_level=consistency,
                timeout=self.settings.timeout,
            )
        )

    def _fetch(self, rows: Sequence[int]) -> None:
        expr = f"{ROW} in [{', '.join(str(r) for r in rows)}]"
        self._remember(self._query(expr, self._hit_fields[:-1], self.settings.consistency))

    def _as_docs(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """A document's metadata as ``docs.jsonl`` holds it: the fields it has (presence flags),
        a date as :func:`~esp_retrieval.subspace.filters.format_date` writes it."""
        out: dict[str, Any] = {}
        for name, kind in self._fields.items():
            if stored.get(presence_field(name)):
                value = stored[name]
                out[name] = format_date(int(value)) if kind == FieldType.DATE else value
        return out

    def documents(self, rows: Iterable[int]) -> list[tuple[str, dict[str, Any]]]:
        """``(id, metadata fields)`` of each row a search returned (the display fields among them)."""
        rows = [int(r) for r in rows]
        missing = [r for r in rows if r not in self._docs]
        if missing:
            self._fetch(missing)
        return [self._docs.get(r, ("", {})) for r in rows]

    # --- writes ---------------------------------------------------------------------------------
    def _rows_of(self, ids: Sequence[str]) -> dict[str, int]:
        got = self._query(f"{ID} in [{', '.join(quote(i) for i in ids)}]", [ID, ROW])
        return {str(r[ID]): int(r[ROW]) for r in got}

    def upsert(self, docs: Sequence[LiveDocument]) -> list[int]:
        """Insert or replace documents by id; visible to every search that starts after it returns.

        A known id keeps its row; a new one gets :func:`live_row`. Returns the rows written.
        """
        for i, d in enumerate(docs):
            try:
                quote(d.id)
            except ValueError as exc:
                raise EngineInputError(f"documents[{i}].id: {exc}", f"documents[{i}].id") from exc
        known = self._rows_of([d.id for d in docs])
        rows = [known.get(d.id, live_row(d.id)) for d in docs]
        fresh = [r for d, r in zip(docs, rows, strict=True) if d.id not in known]
        if fresh:
            clash = self._query(f"{ROW} in [{', '.join(map(str, fresh))}]", [ID, ROW])
            if clash:
                raise EngineInputError(
                    f"document row {clash[0][ROW]} is taken by id {clash[0][ID]!r}", "documents"
                )
        entities = [
            entity(d.id, r, d.vector, d.fields, schema=self.metadata_schema, where=f"documents[{i}].fields")
            for i, (d, r) in enumerate(zip(docs, rows, strict=True))
        ]
        try:
            self._client.upsert(self.settings.collection, entities, timeout=self.settings.timeout)
        except Exception as exc:
            raise NotReadyError(f"milvus: upsert failed: {exc}", retry_after=1.0) from exc
        with self._lock:
            for r in rows:
                self._docs.pop(r, None)
        return rows

    def delete(self, doc_id: str) -> bool:
        """Delete a document by id; ``False`` when there is none."""
        try:
            known = self._rows_of([doc_id])
        except ValueError:  # an id no document can have (a line break)
            return False
        if doc_id not in known:
            return False
        try:
            self._client.delete(self.settings.collection, ids=[doc_id], timeout=self.settings.timeout)
        except Exception as exc:
            raise NotReadyError(f"milvus: delete failed: {exc}", retry_after=1.0) from exc
        with self._lock:
            self._docs.pop(known[doc_id], None)
        return True

    def count(self) -> int:
        return count_rows(self._client, self.settings.collection, self.settings.timeout)
