"""An httpx client for the search service, sync (:class:`ESPClient`) and async (:class:`AsyncESPClient`).

Results are typed models (:mod:`esp_retrieval.client.models`); an error response raises
:class:`ESPError` carrying the service's ``type``, ``message``, ``field`` and status (and
``retry_after`` for 429/503), once a 429 or 503 has been sent again as :class:`RetryPolicy` says
(by default up to 3 times, after the server's ``Retry-After`` with jitter; ``retries=0``: never).
Queries may be given as a text (``str``), a vector (list or numpy array of all D components), a
``{subspace: block}`` mapping, or a ready ``{"text": ...}`` / ``{"vector": ...}`` dict::

    with ESPClient("http://127.0.0.1:8000") as c:
        res = c.search(["what is a bank"], k=5, weights={"semantic": 1.0, "entity": 0.2})
        for hit in res.results[0].hits:
            print(hit.id, hit.score, hit.subspace_scores)

Requests go through httpx (its own default transport, connection pool and exceptions); pass
``transport=`` (any httpx transport, e.g. ``httpx.MockTransport`` in tests) or a ready
``http_client=`` (an ``httpx.Client`` / ``httpx.AsyncClient`` whose timeout, limits, proxies and
certificates you chose, and whose lifetime you own) to change how. The models are the SDK's own
(:mod:`esp_retrieval.client.models`): the client imports nothing of the server.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import numpy as np
import pydantic_core
from pydantic import BaseModel
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_result,
    stop_after_attempt,
    wait_random_exponential,
)

from esp_retrieval.client.models import (
    Assignment,
    ClusterResponse,
    DeleteResponse,
    EmbeddingsResponse,
    Experiments,
    Health,
    LayoutResponse,
    ModelCard,
    ModelList,
    OperatingPoints,
    Readiness,
    ReloadResponse,
    SearchResponse,
    UpsertResponse,
)

# httpcore runs `import sniffio` on every lock of its async pool; when sniffio is not installed
# each failed import searches sys.path again. Caching the miss makes it fail fast; httpcore
# then assumes asyncio, which is what this client uses.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

T = TypeVar("T")
QueryLike = str | Sequence[float] | np.ndarray | Mapping[str, Any]
WeightsLike = Mapping[str, float] | Sequence[float] | np.ndarray


class ESPError(Exception):
    """An error answer from the service (or a response that is not the service's JSON)."""

    def __init__(
        self, status: int, type: str, message: str, field: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {type}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.type = type
        self.message = message
        self.field = field
        self.retry_after = retry_after


def _tolist(x: Any) -> Any:
    return x.tolist() if isinstance(x, np.ndarray) else list(x)


def query_json(query: QueryLike) -> dict[str, Any]:
    """One query as the API's JSON object (see the module docstring for accepted forms)."""
    if isinstance(query, str):
        return {"text": query}
    if isinstance(query, Mapping):
        if set(query) <= {"text", "vector"} and query:
            return dict(query)
        return {"vector": {name: _tolist(block) for name, block in query.items()}}
    return {"vector": _tolist(query)}


def search_json(
    queries: Sequence[QueryLike] | QueryLike,
    *,
    k: int = 10,
    weights: WeightsLike | None = None,
    operating_point: str | None = None,
    experiment: str | None = None,
    unit_id: str | None = None,
    filter: Mapping[str, Any] | None = None,
    offset: int | None = None,
    score_threshold: float | None = None,
    fields: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``POST /v1/search`` body. A lone text, vector or mapping is one query; a 2-D array is rows.
    ``filter``: a metadata filter, e.g. ``{"field": "lang", "eq": "en"}`` (see the README).
    ``offset``: hits of the ranking skipped (page ``p``: ``offset=p * k``); ``score_threshold``:
    only hits scoring at least it; ``fields``: the metadata fields each hit returns (``hit.fields``)."""
    items: list[Any]
    if isinstance(queries, str | Mapping):
        items = [queries]
    elif isinstance(queries, np.ndarray):
        items = [queries] if queries.ndim == 1 else list(queries)
    else:
        items = list(queries)
        if items and isinstance(items[0], int | float):
            items = [items]  # one plain vector
    body: dict[str, Any] = {"queries": [query_json(q) for q in items], "k": k}
    if weights is not None:
        body["weights"] = dict(weights) if isinstance(weights, Mapping) else _tolist(weights)
    for key, value in (
        ("operating_point", operating_point),
        ("experiment", experiment),
        ("unit_id", unit_id),
        ("filter", dict(filter) if filter is not None else None),
        ("offset", offset),
        ("score_threshold", score_threshold),
        ("fields", list(fields) if fields is not None else None),
    ):
        if value is not None:
            body[key] = value
    return body


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


#: answers that say "not now" (queue full, not ready): the request was not served, so it may be sent again
RETRY_STATUSES = frozenset({429, 503})
#: resends of a 429 or 503 answer by default, and the longest wait before any one of them (seconds)
DEFAULT_RETRIES = 3
DEFAULT_MAX_RETRY_WAIT = 5.0
_BACKOFF = 0.1  # seconds: the bound of the first wait when the server names none, doubling per resend


@dataclass(frozen=True)
class RetryPolicy:
    """When a 429 or 503 answer's request is sent again, and after how long (tenacity runs the loop).

    At most ``retries`` resends (0: none, the answer raises at once), each after a wait of at most
    ``max_wait`` seconds: the server's ``Retry-After`` plus up to a fifth of it again (at least
    ``0.1`` s) of random jitter, so clients told the same time do not all come back at once; without
    the header, a random wait below ``0.1 * 2**n`` s (full jitter). An answer whose ``Retry-After``
    exceeds ``max_wait`` is not resent earlier than the server asked: it raises, ``retry_after`` set.
    """

    retries: int = DEFAULT_RETRIES
    max_wait: float = DEFAULT_MAX_RETRY_WAIT

    def __post_init__(self) -> None:
        if self.retries < 0 or not self.max_wait >= 0:
            raise ValueError(f"retries and max_retry_wait must be >= 0, not {self.retries}, {self.max_wait}")

    def again(self, resp: httpx.Response) -> bool:
        """Whether ``resp`` is worth sending again (the attempts left are tenacity's to count)."""
        if resp.status_code not in RETRY_STATUSES:
            return False
        after = _retry_after(resp)
        return after is None or after <= self.max_wait

    def wait(self, state: RetryCallState) -> float:
        """Seconds before the next attempt, never before the server's ``Retry-After``."""
        assert state.outcome is not None
        after = _retry_after(state.outcome.result())
        if after is None:
            return wait_random_exponential(multiplier=_BACKOFF, max=self.max_wait)(state)
        after = max(0.0, after)
        return min(self.max_wait, after + random.uniform(0.0, max(_BACKOFF, after / 5)))

    def _options(self) -> dict[str, Any]:
        return {
            "stop": stop_after_attempt(self.retries + 1),
            "wait": self.wait,
            "retry": retry_if_result(self.again),
            "retry_error_callback": _last_answer,  # attempts spent: the last answer, raised as ESPError
        }

    def send(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        return Retrying(sleep=_sleep, **self._options())(send)

    async def asend(self, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        return await AsyncRetrying(sleep=_asleep, **self._options())(send)


def _last_answer(state: RetryCallState) -> httpx.Response:
    assert state.outcome is not None
    return state.outcome.result()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


async def _asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        if isinstance(body.get("error"), dict):  # OpenAI's shape (/v1/embeddings, /v1/models)
            body = {"type": body["error"]["code"], "message": body["error"]["message"],
                    "field": body["error"].get("param")}
        kind, message, field = body["type"], body["message"], body.get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        kind, message, field = "http_error", resp.text[:500], None
    raise ESPError(resp.status_code, kind, message, field, _retry_after(resp))


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    url: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    retry: bool = True  # False: a 429 or 503 is the answer asked for (the readiness probe)


def _model(cls: type[BaseModel]) -> Callable[[httpx.Response], Any]:
    return lambda r: cls.model_validate_json(r.content)  # pydantic-core parses and validates at once


def _request_args(call: _Call[Any]) -> dict[str, Any]:
    """httpx ``request()`` arguments; a JSON body is encoded by pydantic-core, not the stdlib.

    A 384-float vector costs ~0.5 ms in ``json.dumps`` and ~0.03 ms here. Output is the same
    JSON (NaN and infinities as the stdlib writes them, so the service judges them); what
    pydantic-core cannot encode goes to httpx's own encoder, which raises as before.
    """
    args: dict[str, Any] = {"params": call.params, "headers": call.headers}
    if call.json is None:
        return args
    try:
        args["content"] = pydantic_core.to_json(call.json, inf_nan_mode="constants")
    except (ValueError, TypeError):
        args["json"] = call.json
        return args
    args["headers"] = {**(call.headers or {}), "content-type": "application/json"}
    return args


def _plain(x: Any) -> Any:
    """numpy arrays (and numpy scalars) as JSON types; everything else as it is."""
    if isinstance(x, np.ndarray | np.generic):
        return x.tolist()
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _given(kw: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments that were given (None: the server's default), arrays as lists."""
    return {k: _plain(v) for k, v in kw.items() if v is not None}


class _Calls:
    """Request builders shared by the sync and async clients."""

    def __init__(self, admin_token: str | None) -> None:
        self._admin_token = admin_token

    def search(self, queries: Any, **kw: Any) -> _Call[SearchResponse]:
        return _Call("POST", "/v1/search", _model(SearchResponse), json=search_json(queries, **kw))

    def layout(self) -> _Call[LayoutResponse]:
        return _Call("GET", "/v1/layout", _model(LayoutResponse))

    def health(self) -> _Call[Health]:
        return _Call("GET", "/healthz", _model(Health))

    def ready(self) -> _Call[Readiness]:
        return _Call("GET", "/readyz", _model(Readiness), retry=False)

    def metrics(self) -> _Call[str]:
        return _Call("GET", "/metrics", lambda r: r.text)

    def operating_points(self) -> _Call[OperatingPoints]:
        return _Call("GET", "/v1/operating-points", _model(OperatingPoints))

    def experiments(self) -> _Call[Experiments]:
        return _Call("GET", "/v1/experiments", _model(Experiments))

    def assignment(self, experiment: str, unit_id: str) -> _Call[Assignment]:
        return _Call("GET", f"/v1/experiments/{quote(experiment, safe='')}/assignment", _model(Assignment),
                     params={"unit_id": unit_id})

    def embeddings(self, texts: str | Sequence[str], **kw: Any) -> _Call[EmbeddingsResponse]:
        body = {"input": texts if isinstance(texts, str) else list(texts), **_given(kw)}
        return _Call("POST", "/v1/embeddings", _model(EmbeddingsResponse), json=body)

    def cluster(self, keywords: Sequence[str], **kw: Any) -> _Call[ClusterResponse]:
        body = {"keywords": list(keywords), **_given(kw)}
        return _Call("POST", "/v1/cluster", _model(ClusterResponse), json=body)

    def models(self) -> _Call[ModelList]:
        return _Call("GET", "/v1/models", _model(ModelList))

    def model(self, name: str) -> _Call[ModelCard]:
        return _Call("GET", f"/v1/models/{quote(name, safe='')}", _model(ModelCard))

    def _admin(self, token: str | None) -> dict[str, str] | None:
        tok = token if token is not None else self._admin_token
        return {"Authorization": f"Bearer {tok}"} if tok else None

    def upsert_documents(self, documents: Sequence[Mapping[str, Any]], token: str | None = None
                         ) -> _Call[UpsertResponse]:
        body = {"documents": [_plain(d) for d in documents]}
        return _Call("POST", "/v1/documents", _model(UpsertResponse), json=body, headers=self._admin(token))

    def delete_document(self, doc_id: str, token: str | None = None) -> _Call[DeleteResponse]:
        return _Call("DELETE", f"/v1/documents/{quote(doc_id, safe='')}", _model(DeleteResponse),
                     headers=self._admin(token))

    def reload(self, path: str | None = None, token: str | None = None, sha256: str | None = None
               ) -> _Call[ReloadResponse]:
        headers = self._admin(token)
        body = _given({"path": str(path) if path is not None else None, "sha256": sha256}) or None
        return _Call("POST", "/v1/admin/reload", _model(ReloadResponse), json=body, headers=headers)


def _own_or_given(http_client: Any, transport: Any) -> bool:
    """True when the SDK builds (and closes) its httpx client; refuses both arguments at once."""
    if http_client is not None and transport is not None:
        raise ValueError("give transport= or http_client=, not both (the client carries its transport)")
    return http_client is None


class ESPClient:
    """Blocking client. ``admin_token`` is only sent to ``/v1/admin/*``. ``retries``: how often a
    429 (queue full) or 503 (not ready) answer is sent again (3 by default, 0: raise
    :class:`ESPError` at once), each after the server's ``Retry-After`` with jitter, waiting at most
    ``max_retry_wait`` seconds (:class:`RetryPolicy`; ``ready()`` is never resent). ``transport`` or
    ``http_client``: see the module docstring (``timeout`` applies to a client built here)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        admin_token: str | None = None,
        retries: int = DEFAULT_RETRIES,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._retry = RetryPolicy(retries, max_retry_wait)
        self._owned = _own_or_given(http_client, transport)
        if http_client is None:
            http_client = httpx.Client(timeout=timeout, transport=transport)
        self._http = http_client
        self._base = base_url.rstrip("/")
        self._calls = _Calls(admin_token)

    def _do(self, call: _Call[T]) -> T:
        def send() -> httpx.Response:
            return self._http.request(call.method, self._base + call.url, **_request_args(call))

        resp = self._retry.send(send) if call.retry else send()
        raise_for_error(resp)
        return call.parse(resp)

    def search(self, queries: Sequence[QueryLike] | QueryLike, **kw: Any) -> SearchResponse:
        """``kw``: ``k``, ``weights``, ``operating_point``, ``experiment``, ``unit_id``, ``filter``,
        ``offset``, ``score_threshold``, ``fields``."""
        return self._do(self._calls.search(queries, **kw))

    def layout(self) -> LayoutResponse:
        return self._do(self._calls.layout())

    def health(self) -> Health:
        return self._do(self._calls.health())

    def ready(self) -> Readiness:
        """Raises :class:`ESPError` (503) while not ready."""
        return self._do(self._calls.ready())

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> Readiness:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.ready()
            except (ESPError, httpx.TransportError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(interval)

    def metrics(self) -> str:
        return self._do(self._calls.metrics())

    def operating_points(self) -> OperatingPoints:
        return self._do(self._calls.operating_points())

    def experiments(self) -> Experiments:
        return self._do(self._calls.experiments())

    def assignment(self, experiment: str, unit_id: str) -> Assignment:
        return self._do(self._calls.assignment(experiment, unit_id))

    def embeddings(self, texts: str | Sequence[str], **kw: Any) -> EmbeddingsResponse:
        """``kw``: ``subspaces``, ``weights``, ``operating_point``, ``encoding_format``, ``dimensions``."""
        return self._do(self._calls.embeddings(texts, **kw))

    def cluster(self, keywords: Sequence[str], **kw: Any) -> ClusterResponse:
        """``kw``: ``weights``, ``operating_point``, ``method``, ``threshold``, ``min_cluster_size``."""
        return self._do(self._calls.cluster(keywords, **kw))

    def models(self) -> ModelList:
        """``GET /v1/models``: the served encoder (its id is the bundle version)."""
        return self._do(self._calls.models())

    def model(self, name: str) -> ModelCard:
        """Raises :class:`ESPError` (404) unless ``name`` is the served bundle version."""
        return self._do(self._calls.model(name))

    def upsert_documents(self, documents: Sequence[Mapping[str, Any]], *, token: str | None = None
                         ) -> UpsertResponse:
        """``documents``: ``{"id", "text" and/or "vector", "fields"}`` each (admin token)."""
        return self._do(self._calls.upsert_documents(documents, token))

    def delete_document(self, doc_id: str, *, token: str | None = None) -> DeleteResponse:
        return self._do(self._calls.delete_document(doc_id, token))

    def reload(self, path: str | None = None, *, token: str | None = None, sha256: str | None = None
               ) -> ReloadResponse:
        """``path``: a bundle directory, or a URI of one in object storage with ``sha256`` (the
        digest of its manifest.json)."""
        return self._do(self._calls.reload(path, token, sha256))

    def close(self) -> None:
        """Closes the httpx client if this SDK built it (a given ``http_client`` stays open)."""
        if self._owned:
            self._http.close()

    def __enter__(self) -> ESPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncESPClient:
    """The same API as :class:`ESPClient` (retries included), awaitable; one connection pool for many
    concurrent calls."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        admin_token: str | None = None,
        max_connections: int = 256,
        retries: int = DEFAULT_RETRIES,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._retry = RetryPolicy(retries, max_retry_wait)
        self._owned = _own_or_given(http_client, transport)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        if http_client is None:
            http_client = httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)
        self._http = http_client
        self._base = base_url.rstrip("/")
        self._calls = _Calls(admin_token)

    async def _do(self, call: _Call[T]) -> T:
        async def send() -> httpx.Response:
            return await self._http.request(call.method, self._base + call.url, **_request_args(call))

        resp = await self._retry.asend(send) if call.retry else await send()
        raise_for_error(resp)
        return call.parse(resp)

    async def search(self, queries: Sequence[QueryLike] | QueryLike, **kw: Any) -> SearchResponse:
        return await self._do(self._calls.search(queries, **kw))

    async def layout(self) -> LayoutResponse:
        return await self._do(self._calls.layout())

    async def health(self) -> Health:
        return await self._do(self._calls.health())

    async def ready(self) -> Readiness:
        return await self._do(self._calls.ready())

    async def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> Readiness:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await self.ready()
            except (ESPError, httpx.TransportError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(interval)

    async def metrics(self) -> str:
        return await self._do(self._calls.metrics())

    async def operating_points(self) -> OperatingPoints:
        return await self._do(self._calls.operating_points())

    async def experiments(self) -> Experiments:
        return await self._do(self._calls.experiments())

    async def assignment(self, experiment: str, unit_id: str) -> Assignment:
        return await self._do(self._calls.assignment(experiment, unit_id))

    async def embeddings(self, texts: str | Sequence[str], **kw: Any) -> EmbeddingsResponse:
        return await self._do(self._calls.embeddings(texts, **kw))

    async def cluster(self, keywords: Sequence[str], **kw: Any) -> ClusterResponse:
        return await self._do(self._calls.cluster(keywords, **kw))

    async def models(self) -> ModelList:
        return await self._do(self._calls.models())

    async def model(self, name: str) -> ModelCard:
        return await self._do(self._calls.model(name))

    async def upsert_documents(self, documents: Sequence[Mapping[str, Any]], *, token: str | None = None
                               ) -> UpsertResponse:
        return await self._do(self._calls.upsert_documents(documents, token))

    async def delete_document(self, doc_id: str, *, token: str | None = None) -> DeleteResponse:
        return await self._do(self._calls.delete_document(doc_id, token))

    async def reload(self, path: str | None = None, *, token: str | None = None, sha256: str | None = None
                     ) -> ReloadResponse:
        return await self._do(self._calls.reload(path, token, sha256))

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncESPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
