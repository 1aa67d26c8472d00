"""An httpx client for the search service, sync (:class:`ESPClient`) and async (:class:`AsyncESPClient`).

Results are the typed models of :mod:`service.schemas`; an error response raises
:class:`ESPError` carrying the service's ``type``, ``message``, ``field`` and status (and
``retry_after`` for 429/503). Queries may be given as a text (``str``), a vector (list or
numpy array of all D components), a ``{subspace: block}`` mapping, or a ready
``{"text": ...}`` / ``{"vector": ...}`` dict::

    with ESPClient("http://127.0.0.1:8000") as c:
        res = c.search(["what is a bank"], k=5, weights={"semantic": 1.0, "entity": 0.2})
        for hit in res.results[0].hits:
            print(hit.id, hit.score, hit.subspace_scores)

Client CPU per request (one 384-float query, 2-core machine): httpx's default transport cost
~2 ms at one connection and ~8 ms at 32 (httpcore's pool scans every connection per request).
The clients therefore default to the lean HTTP/1.1 transports of :mod:`service.client_transport`,
and a plain call (no params, own headers, cookies, proxy, auth or hooks) goes to it as bytes
prepared from httpx's own request models (:meth:`_Builder.wire`): ~0.35 ms at 1 and at 32
connections. Pass ``transport=`` (e.g. ``httpx.AsyncHTTPTransport()``) to send through httpx
unchanged.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import httpx
import numpy as np
import pydantic_core
from pydantic import BaseModel

from service.client_transport import (
    AsyncHTTP11Transport,
    HTTP11Transport,
    ResponseParser,
    origin_of,
    serialize,
)
from service.schemas import Health, LayoutResponse, Readiness, ReloadResponse, SearchResponse

# httpcore runs `import sniffio` several times per async request; when sniffio is not installed
# each failed import searches sys.path again (~1 ms apiece, the client's largest cost). Caching
# the miss makes it fail fast; httpcore then assumes asyncio, which is what this client uses.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

T = TypeVar("T")
_HTTPX_LOG = logging.getLogger("httpx")
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
) -> dict[str, Any]:
    """The ``POST /v1/search`` body. A lone text, vector or mapping is one query; a 2-D array is rows."""
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


def raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        kind, message, field = body["type"], body["message"], body.get("field")
    except (ValueError, KeyError, TypeError):
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


def _model(cls: type[BaseModel]) -> Callable[[httpx.Response], Any]:
    return lambda r: cls.model_validate_json(r.content)  # pydantic-core parses and validates at once


def _encode(body: Any) -> bytes | None:
    """JSON bytes by pydantic-core, not the stdlib; None where it cannot encode ``body``.

    A 384-float vector costs ~0.5 ms in ``json.dumps`` and ~0.03 ms here. Output is the same
    JSON (NaN and infinities as the stdlib writes them, so the service judges them); what
    pydantic-core cannot encode goes to httpx's own encoder, which raises as before.
    """
    try:
        return pydantic_core.to_json(body, inf_nan_mode="constants")
    except (ValueError, TypeError):
        return None


def _request_args(call: _Call[Any]) -> dict[str, Any]:
    """httpx ``request()`` arguments; a JSON body is encoded by :func:`_encode`."""
    args: dict[str, Any] = {"params": call.params, "headers": call.headers}
    if call.json is None:
        return args
    content = _encode(call.json)
    if content is None:
        args["json"] = call.json
        return args
    args["content"] = content
    args["headers"] = {**(call.headers or {}), "content-type": "application/json"}
    return args


class _Wire(NamedTuple):
    """A request serialised for the lean transport."""

    data: bytes
    origin: tuple[str, int]
    url: httpx.URL


class _Builder:
    """Builds each call's request: an :class:`httpx.Request` as ``client.build_request`` would,
    cheaper, or (:meth:`wire`) the bytes httpx would send, for the client's lean transport.

    ``build_request`` parses and merges the URL (twice), the client's query params and headers on
    every call: ~90 us of the ~260 us httpx's client layer spends per request. A call without
    params, own headers or cookies in the client's jar gets the merged URL from a per-path cache
    and one prebuilt header set instead; the result is the same request. Anything else takes
    ``build_request``.
    """

    def __init__(self, http: httpx.Client | httpx.AsyncClient, lean: bool = False) -> None:
        self._http = http
        self._urls: dict[str, httpx.URL] = {}
        self._headers: dict[bool, httpx.Headers] = {}
        # (method, path, has body) -> the serialised head without Content-Length, or None (not http)
        self._heads: dict[tuple[str, str, bool], tuple[bytes, tuple[str, int], httpx.URL] | None] = {}
        self._lean = lean and not (http.trust_env and _environment_proxy())

    def __call__(self, call: _Call[Any]) -> httpx.Request:
        http = self._http
        args = _request_args(call)
        if call.params is not None or call.headers or "json" in args or http.cookies:
            return http.build_request(call.method, call.url, **args)
        url = self._urls.get(call.url)
        if url is None:
            url = self._urls[call.url] = http.build_request(call.method, call.url).url
        content = args.get("content")
        headers = self._headers.get(content is not None)
        if headers is None:
            headers = self._headers[content is not None] = httpx.Headers(http.headers)
            headers.update(args["headers"] or {})
        return httpx.Request(
            call.method, url, headers=headers, content=content, extensions={"timeout": http.timeout.as_dict()}
        )

    def wire(self, call: _Call[Any]) -> _Wire | None:
        """The whole request as bytes for the client's lean transport, byte for byte what httpx
        would send (headers from a request built once by httpx's models, the body's length
        appended); None where httpx must send it: another transport, a proxy, auth, event hooks,
        cookies, query params, own headers, a body pydantic-core cannot encode, not ``http://``,
        a closed client (httpx raises)."""
        http = self._http
        if not self._lean or http.is_closed or call.params is not None or call.headers or http.cookies:
            return None
        if http.auth is not None:
            return None
        if http.event_hooks["request"] or http.event_hooks["response"]:
            return None
        content = None if call.json is None else _encode(call.json)
        if call.json is not None and content is None:
            return None
        key = (call.method, call.url, content is not None)
        if key not in self._heads:
            self._heads[key] = self._head(self(call), content is not None)
        head = self._heads[key]
        if head is None:
            return None
        data, origin, url = head
        if content is not None:
            data = b"".join((data, b"Content-Length: %d\r\n\r\n" % len(content), content))
        return _Wire(data, origin, url)

    @staticmethod
    def _head(request: httpx.Request, has_body: bool) -> tuple[bytes, tuple[str, int], httpx.URL] | None:
        if request.url.scheme != "http":
            return None
        raw = serialize(request, b"")
        if has_body:  # the head up to its last header line; each body brings its own length
            lines = raw[: -len(b"\r\n\r\n")].split(b"\r\n")
            raw = b"".join(
                line + b"\r\n" for line in lines if not line.lower().startswith(b"content-length:")
            )
        return raw, origin_of(request.url), request.url

    def response(self, call: _Call[Any], wire: _Wire, parser: ResponseParser) -> httpx.Response:
        """The answer to a wired request as the httpx client would hand it back: body read,
        cookies taken into the client's jar, the ``httpx`` logger's request line."""
        resp = parser.response()
        resp.read()
        if "set-cookie" in resp.headers or _HTTPX_LOG.isEnabledFor(logging.INFO):
            resp.request = self(call)
            self._http.cookies.extract_cookies(resp)
            _HTTPX_LOG.info(
                'HTTP Request: %s %s "%s %d %s"',
                call.method,
                wire.url,
                resp.http_version,
                resp.status_code,
                resp.reason_phrase,
            )
        return resp


def _environment_proxy() -> bool:
    """Whether the environment names a proxy that httpx (``trust_env``) could route ``http://`` through."""
    proxies = urllib.request.getproxies()
    return bool(proxies.get("http") or proxies.get("all"))


def _json(r: httpx.Response) -> Any:
    return r.json()


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
        return _Call("GET", "/readyz", _model(Readiness))

    def metrics(self) -> _Call[str]:
        return _Call("GET", "/metrics", lambda r: r.text)

    def operating_points(self) -> _Call[Any]:
        return _Call("GET", "/v1/operating-points", _json)

    def experiments(self) -> _Call[Any]:
        return _Call("GET", "/v1/experiments", _json)

    def assignment(self, experiment: str, unit_id: str) -> _Call[Any]:
        return _Call("GET", f"/v1/experiments/{experiment}/assignment", _json, params={"unit_id": unit_id})

    def reload(self, path: str | None = None, token: str | None = None) -> _Call[ReloadResponse]:
        tok = token if token is not None else self._admin_token
        headers = {"Authorization": f"Bearer {tok}"} if tok else None
        body = {"path": str(path)} if path is not None else None
        return _Call("POST", "/v1/admin/reload", _model(ReloadResponse), json=body, headers=headers)


class ESPClient:
    """Blocking client. ``admin_token`` is only sent to ``/v1/admin/*``."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        admin_token: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._lean = HTTP11Transport() if transport is None else None
        self._http = httpx.Client(
            base_url=base_url, timeout=timeout, transport=transport if transport is not None else self._lean
        )
        self._calls = _Calls(admin_token)
        self._build = _Builder(self._http, lean=self._lean is not None)

    def _do(self, call: _Call[T]) -> T:
        wire = self._build.wire(call)
        resp = self._http.send(self._build(call)) if wire is None else self._send_wire(call, wire)
        raise_for_error(resp)
        return call.parse(resp)

    def _send_wire(self, call: _Call[Any], wire: _Wire) -> httpx.Response:
        assert self._lean is not None
        try:
            parser = self._lean.exchange(wire.origin, wire.data, self._http.timeout.as_dict())
        except httpx.RequestError as exc:
            exc.request = self._build(call)  # as httpx's client does
            raise
        return self._build.response(call, wire, parser)

    def search(self, queries: Sequence[QueryLike] | QueryLike, **kw: Any) -> SearchResponse:
        """``kw``: ``k``, ``weights``, ``operating_point``, ``experiment``, ``unit_id``."""
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

    def operating_points(self) -> Any:
        return self._do(self._calls.operating_points())

    def experiments(self) -> Any:
        return self._do(self._calls.experiments())

    def assignment(self, experiment: str, unit_id: str) -> Any:
        return self._do(self._calls.assignment(experiment, unit_id))

    def reload(self, path: str | None = None, *, token: str | None = None) -> ReloadResponse:
        return self._do(self._calls.reload(path, token))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ESPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncESPClient:
    """The same API as :class:`ESPClient`, awaitable; one connection pool for many concurrent calls."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        admin_token: str | None = None,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._lean = AsyncHTTP11Transport(limits) if transport is None else None
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            limits=limits,
            transport=transport if transport is not None else self._lean,
        )
        self._calls = _Calls(admin_token)
        self._build = _Builder(self._http, lean=self._lean is not None)

    async def _do(self, call: _Call[T]) -> T:
        wire = self._build.wire(call)
        resp = await (self._http.send(self._build(call)) if wire is None else self._send_wire(call, wire))
        raise_for_error(resp)
        return call.parse(resp)

    async def _send_wire(self, call: _Call[Any], wire: _Wire) -> httpx.Response:
        assert self._lean is not None
        try:
            parser = await self._lean.exchange(wire.origin, wire.data, self._http.timeout.as_dict())
        except httpx.RequestError as exc:
            exc.request = self._build(call)  # as httpx's client does
            raise
        return self._build.response(call, wire, parser)

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

    async def operating_points(self) -> Any:
        return await self._do(self._calls.operating_points())

    async def experiments(self) -> Any:
        return await self._do(self._calls.experiments())

    async def assignment(self, experiment: str, unit_id: str) -> Any:
        return await self._do(self._calls.assignment(experiment, unit_id))

    async def reload(self, path: str | None = None, *, token: str | None = None) -> ReloadResponse:
        return await self._do(self._calls.reload(path, token))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncESPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
