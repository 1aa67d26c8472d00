"""Lean HTTP/1.1 transports for httpx: keep-alive connections without httpcore, anyio or h11.

httpx's default transport (httpcore 1.0) costs the client ~1.3 ms of CPU per request at one
connection and ~7 ms at 32 on a 2-core machine: its pool scans every connection and every
queued request on each request and event (``is_idle`` x connections x requests), anyio wraps
every read and write in cancel scopes, and h11 validates each header. These transports speak
plain ``http://`` HTTP/1.1 themselves, the request written in one piece and the response parsed
from the bytes as they come, and keep idle connections on a stack (O(1) per request). Anything
else (``https://``) goes to httpx's own transport, so TLS settings work as before.

Semantics kept from httpx: its exceptions (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``PoolTimeout``, ``RemoteProtocolError``, ``ReadError``, ``WriteError``), the
``timeout`` extension's connect/read/pool limits (async: the request is written without waiting,
so its write limit is the read limit's), ``Limits`` (max connections, keep-alive connections and
expiry), and the raw body handed back for httpx to decode (gzip and the like).

Kept-alive connections the server closed: httpcore polls each idle socket before reusing it.
Here the event loop reports the close (async), and a request that fails on a *reused*
connection before any response byte arrived is sent once more on a new connection (both). That
resends a request the server read and then dropped without answering, as browsers do for a
reused connection; the service's calls are safe to repeat (search reads, reload is idempotent).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import sys
import threading
import time
from typing import Any, Generic, Protocol, TypeVar

import httpx

_CRLF2 = b"\r\n\r\n"
_NO_BODY_STATUS = frozenset({204, 304})


def _timeouts(request: httpx.Request) -> dict[str, float | None]:
    return request.extensions.get("timeout") or {}


def serialize(request: httpx.Request, body: bytes) -> bytes:
    """The whole request (head + body) as one bytes object: one write, one syscall."""
    parts = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in request.headers.raw:
        parts += (name, b": ", value, b"\r\n")
        if name.lower() == b"transfer-encoding" and value.lower() == b"chunked":
            chunked = True
    parts.append(b"\r\n")
    if chunked:  # the body was read whole: one chunk and the terminator
        parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n")
    else:
        parts.append(body)
    return b"".join(parts)


class ResponseParser:
    """Incremental HTTP/1.1 response parser (RFC 9112): head, then a body framed by
    Content-Length, chunked transfer coding, or the connection's end; 1xx answers skipped."""

    __slots__ = (
        "_left",
        "_mode",
        "_started",
        "body",
        "buf",
        "done",
        "head_only",
        "headers",
        "keep_alive",
        "reason",
        "status",
    )

    def __init__(self, head_only: bool) -> None:
        self.head_only = head_only  # HEAD: the answer has no body whatever its headers say
        self.buf = b""
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.keep_alive = True
        self.done = False
        self._left = 0
        self._started = False
        self._mode = ""  # "" head pending, "length", "chunk-size", "chunk-data", "trailer", "close"

    @property
    def started(self) -> bool:
        """Whether any byte of an answer arrived."""
        return self._started

    def feed(self, data: bytes) -> bool:
        """Take bytes off the wire; True once the response is complete."""
        self._started = True
        self.buf = self.buf + data if self.buf else data
        while not self.done:
            if not self._step():
                break
        return self.done

    def eof(self) -> None:
        """The peer closed: completes a body read until close, otherwise the answer is cut."""
        if self._mode == "close":
            self.body.append(self.buf)
            self.buf = b""
            self.done = True
            return
        if not self.started:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def _step(self) -> bool:
        """Advance by one state; False when more bytes are needed."""
        return _STEPS[self._mode](self)

    def _length(self) -> bool:
        if len(self.buf) < self._left:
            return False
        self.body.append(self.buf[: self._left])
        self.buf = self.buf[self._left :]
        self.done = True
        return True

    def _until_close(self) -> bool:
        self.body.append(self.buf)
        self.buf = b""
        return False

    def _chunk_size(self) -> bool:
        end = self.buf.find(b"\r\n")
        if end < 0:
            return False
        try:
            size = int(self.buf[:end].split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad chunk size line {self.buf[:end][:40]!r}") from None
        self.buf = self.buf[end + 2 :]
        self._left, self._mode = size, ("chunk-data" if size else "trailer")
        return True

    def _chunk_data(self) -> bool:
        if len(self.buf) < self._left + 2:
            return False
        self.body.append(self.buf[: self._left])
        self.buf = self.buf[self._left + 2 :]
        self._mode = "chunk-size"
        return True

    def _trailer(self) -> bool:
        """Trailer fields up to an empty line (ignored, as httpx's default transport does)."""
        end = self.buf.find(b"\r\n")
        if end < 0:
            return False
        self.buf = self.buf[end + 2 :]
        self.done = end == 0
        return True

    def _parse_head(self) -> bool:
        end = self.buf.find(_CRLF2)
        if end < 0:
            if len(self.buf) > 65536:
                raise httpx.RemoteProtocolError("response head larger than 64 KiB")
            return False
        lines = self.buf[:end].split(b"\r\n")
        self.buf = self.buf[end + 4 :]
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise httpx.RemoteProtocolError(f"bad status line {lines[0][:80]!r}")
        status = int(code)
        headers = []
        length: int | None = None
        chunked = False
        close = version == b"HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise httpx.RemoteProtocolError(f"bad header line {line[:80]!r}")
            value = value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise httpx.RemoteProtocolError(f"bad Content-Length {value[:40]!r}")
                length = int(value)
            elif lower == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif lower == b"connection":
                tokens = {t.strip() for t in value.lower().split(b",")}
                close = b"close" in tokens or (close and b"keep-alive" not in tokens)
        if 100 <= status < 200:
            if status == 101:
                raise httpx.RemoteProtocolError("protocol switch (101) is not supported by this transport")
            return True  # informational: the real answer follows
        self.status, self.reason, self.headers, self.keep_alive = status, reason, headers, not close
        if self.head_only or status in _NO_BODY_STATUS:
            self.done = True
        elif chunked:
            self._mode = "chunk-size"
        elif length is not None:
            self._mode, self._left = "length", length
        else:
            self._mode, self.keep_alive = "close", False
        return True

    def response(self) -> httpx.Response:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        return httpx.Response(
            self.status,
            headers=self.headers,
            stream=httpx.ByteStream(body),  # raw: httpx decodes any Content-Encoding
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": self.reason},
        )


# parser state -> step; "" is the head, not yet complete
_STEPS = {
    "": ResponseParser._parse_head,
    "length": ResponseParser._length,
    "close": ResponseParser._until_close,
    "chunk-size": ResponseParser._chunk_size,
    "chunk-data": ResponseParser._chunk_data,
    "trailer": ResponseParser._trailer,
}


def origin_of(url: httpx.URL) -> tuple[str, int]:
    """(host, port) to connect to; the host IDNA-encoded, as httpx connects."""
    return url.raw_host.decode("ascii"), url.port or 80


def _connect_error(exc: OSError, origin: tuple[str, int]) -> httpx.ConnectError:
    return httpx.ConnectError(f"{exc} (connecting to {origin[0]}:{origin[1]})")


# -- async ---------------------------------------------------------------------------------------


class _StaleConnectionError(Exception):
    """The connection died before any response byte: on a reused one, send again on a new one."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


class _Connection(Protocol):
    origin: tuple[str, int]

    def close(self) -> None: ...


C = TypeVar("C", bound=_Connection)


class _Pool(Generic[C]):
    """What both transports keep: the ``Limits``, idle connections per origin, the open count."""

    def __init__(self, limits: httpx.Limits | None, fallback: dict[str, Any]) -> None:
        limits = limits or httpx.Limits()
        self._max = limits.max_connections if limits.max_connections is not None else sys.maxsize
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._fallback_kw = {"limits": limits, **fallback}
        self._idle: dict[tuple[str, int], list[C]] = {}
        self._open = 0

    def _drop(self, conn: C) -> None:
        with contextlib.suppress(RuntimeError):  # an async connection's event loop may be closed already
            conn.close()
        self._open -= 1

    def _evict_other(self, origin: tuple[str, int]) -> bool:
        """At the limit: close an idle connection to another origin to make room."""
        for other, idle in self._idle.items():
            if other != origin and idle:
                self._drop(idle.pop(0))
                return True
        return False

    def _drop_idle(self) -> None:
        for idle in self._idle.values():
            while idle:
                self._drop(idle.pop())


class _AsyncConnection(asyncio.Protocol):
    """One keep-alive connection; the protocol fills the parser and wakes the waiting request."""

    def __init__(self, origin: tuple[str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self._parser: ResponseParser | None = None
        self._waiter: asyncio.Future[ResponseParser] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Read timeout: one timer per connection, not per request. It fires at most every
        # `read timeout` seconds and re-arms itself from the last activity while a request is in
        # flight (a timer per request cost ~40 us: a handle, a heap push, a cancel).
        self._last_rx = 0.0
        self._read_timeout: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        parser, waiter = self._parser, self._waiter
        if parser is None or waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: the connection's framing is lost
            return
        self._last_rx = self._loop.time()  # type: ignore[union-attr]
        try:
            if parser.feed(data):
                waiter.set_result(parser)
        except httpx.RemoteProtocolError as exc:
            waiter.set_exception(exc)

    def eof_received(self) -> bool:
        self.closed = True
        self._finish(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        parser, waiter = self._parser, self._waiter
        if parser is None or waiter is None or waiter.done():
            return
        err: httpx.TransportError
        if exc is None:
            try:
                parser.eof()
                waiter.set_result(parser)
                return
            except httpx.RemoteProtocolError as cut:
                err = cut
        else:
            err = httpx.ReadError(str(exc) or type(exc).__name__)
        waiter.set_exception(_StaleConnectionError(err) if self.reused and not parser.started else err)

    # request side
    def usable(self, now: float, expiry: float | None, loop: asyncio.AbstractEventLoop) -> bool:
        """Open, not expired, and on the running loop (a client reused under a new loop)."""
        t = self.transport
        fresh = expiry is None or now - self.idle_since < expiry
        return not self.closed and t is not None and not t.is_closing() and fresh and self._loop is loop

    async def exchange(self, data: bytes, head_only: bool, read_timeout: float | None) -> ResponseParser:
        assert self.transport is not None
        assert self._loop is not None
        loop = self._loop
        parser = self._parser = ResponseParser(head_only)
        waiter = self._waiter = loop.create_future()
        self._last_rx = now = loop.time()
        self._read_timeout = read_timeout
        if read_timeout is not None and (self._timer is None or self._timer_at > now + read_timeout):
            self._arm(now + read_timeout)
        try:
            self.transport.write(data)
            return await waiter
        finally:
            self._parser = self._waiter = None
            if not parser.done:
                self.close()  # timed out, cancelled or broken: the connection's state is unknown

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)  # type: ignore[union-attr]
        self._timer_at = when

    def _on_timer(self) -> None:
        self._timer = None
        waiter, timeout = self._waiter, self._read_timeout
        if waiter is None or waiter.done() or timeout is None:
            return  # idle: the next request arms it again
        due = self._last_rx + timeout
        if due > self._loop.time():  # type: ignore[union-attr]
            self._arm(due)
        else:
            waiter.set_exception(httpx.ReadTimeout(f"no response bytes for {timeout:g} s"))

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class AsyncHTTP11Transport(_Pool["_AsyncConnection"], httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=AsyncHTTP11Transport(limits))``: lean ``http://`` HTTP/1.1."""

    def __init__(self, limits: httpx.Limits | None = None, **fallback: Any) -> None:
        _Pool.__init__(self, limits, fallback)
        self._fallback: httpx.AsyncHTTPTransport | None = None
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport(**self._fallback_kw)
            return await self._fallback.handle_async_request(request)
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        data = serialize(request, body)
        parser = await self.exchange(
            origin_of(request.url), data, _timeouts(request), request.method == "HEAD"
        )
        return parser.response()

    async def exchange(
        self, origin: tuple[str, int], data: bytes, timeouts: dict[str, float | None], head_only: bool = False
    ) -> ResponseParser:
        """Send one serialised request to ``origin`` (host, port) over a pooled connection; the
        parsed answer. Raises httpx's transport exceptions (without ``.request``)."""
        for attempt in range(2):
            conn = await self._acquire(origin, timeouts)
            parser = None
            try:
                parser = await conn.exchange(data, head_only, timeouts.get("read"))
            except _StaleConnectionError as retry:
                if attempt == 0:
                    continue
                raise retry.error from None
            finally:
                self._release(conn, parser is not None and parser.keep_alive)
            return parser
        raise AssertionError("unreachable")  # pragma: no cover

    async def _acquire(self, origin: tuple[str, int], timeouts: dict[str, float | None]) -> _AsyncConnection:
        loop = asyncio.get_running_loop()
        deadline = None if timeouts.get("pool") is None else loop.time() + timeouts["pool"]  # type: ignore[operator]
        while True:
            idle = self._idle.get(origin)
            now = loop.time()
            while idle:
                conn = idle.pop()
                if conn.usable(now, self._expiry, loop):
                    conn.reused = True
                    return conn
                self._drop(conn)
            if self._open >= self._max and not self._evict_other(origin):
                waiter = loop.create_future()
                self._waiters.append(waiter)
                try:
                    left = None if deadline is None else max(0.0, deadline - loop.time())
                    await asyncio.wait_for(waiter, left)
                except TimeoutError:
                    raise httpx.PoolTimeout(f"no free connection within {timeouts['pool']:g} s") from None
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():
                        self._wake()  # woken, then cancelled: pass the free slot on
                    raise
                finally:
                    if not waiter.done():
                        waiter.cancel()
                continue
            self._open += 1
            try:
                return await self._connect(loop, origin, timeouts.get("connect"))
            except BaseException:
                self._open -= 1
                self._wake()
                raise

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, origin: tuple[str, int], timeout: float | None
    ) -> _AsyncConnection:
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _AsyncConnection(origin), origin[0], origin[1]), timeout
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(
                f"connecting to {origin[0]}:{origin[1]} took over {timeout:g} s"
            ) from None
        except OSError as exc:
            raise _connect_error(exc, origin) from exc
        return conn

    def _release(self, conn: _AsyncConnection, keep: bool) -> None:
        if keep and not conn.closed:
            idle = self._idle.setdefault(conn.origin, [])
            if len(idle) < (self._max_idle if self._max_idle is not None else len(idle) + 1):
                conn.idle_since = asyncio.get_running_loop().time()
                idle.append(conn)
                self._wake()
                return
        self._drop(conn)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._drop_idle()
        if self._fallback is not None:
            await self._fallback.aclose()


# -- sync ----------------------------------------------------------------------------------------


class _SyncConnection:
    __slots__ = ("idle_since", "origin", "sock")

    def __init__(self, origin: tuple[str, int], sock: socket.socket) -> None:
        self.origin, self.sock, self.idle_since = origin, sock, 0.0

    def exchange(self, data: bytes, head_only: bool, timeouts: dict[str, float | None]) -> ResponseParser:
        """Raises :class:`_StaleConnectionError` when the connection fails before any response byte."""
        sock = self.sock
        write, read = timeouts.get("write"), timeouts.get("read")
        sock.settimeout(write)
        try:
            sock.sendall(data)
        except TimeoutError:
            raise httpx.WriteTimeout(f"request not written within {write:g} s") from None
        except OSError as exc:
            raise _StaleConnectionError(httpx.WriteError(str(exc))) from exc
        parser = ResponseParser(head_only)
        if read != write:
            sock.settimeout(read)
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise httpx.ReadTimeout(f"no response bytes for {read:g} s") from None
            except OSError as exc:
                error = httpx.ReadError(str(exc))
                if not parser.started:
                    raise _StaleConnectionError(error) from exc
                raise error from exc
            if not chunk:
                try:
                    parser.eof()
                except httpx.RemoteProtocolError as cut:
                    if not parser.started:
                        raise _StaleConnectionError(cut) from None
                    raise
                return parser
            if parser.feed(chunk):
                return parser

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class HTTP11Transport(_Pool["_SyncConnection"], httpx.BaseTransport):
    """``httpx.Client(transport=HTTP11Transport(limits))``: lean ``http://`` HTTP/1.1 on blocking
    sockets; thread-safe (a lock guards the pool, each request holds its connection alone)."""

    def __init__(self, limits: httpx.Limits | None = None, **fallback: Any) -> None:
        _Pool.__init__(self, limits, fallback)
        self._fallback: httpx.HTTPTransport | None = None
        self._cond = threading.Condition()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.HTTPTransport(**self._fallback_kw)
            return self._fallback.handle_request(request)
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = request.read()
        data = serialize(request, body)
        return self.exchange(
            origin_of(request.url), data, _timeouts(request), request.method == "HEAD"
        ).response()

    def exchange(
        self, origin: tuple[str, int], data: bytes, timeouts: dict[str, float | None], head_only: bool = False
    ) -> ResponseParser:
        """Send one serialised request to ``origin`` (host, port) over a pooled connection; the
        parsed answer. Raises httpx's transport exceptions (without ``.request``)."""
        for attempt in range(2):
            conn, reused = self._acquire(origin, timeouts)
            parser = None
            try:
                parser = conn.exchange(data, head_only, timeouts)
            except _StaleConnectionError as retry:
                if reused and attempt == 0:
                    continue
                raise retry.error from None
            finally:
                self._release(conn, parser is not None and parser.keep_alive)
            return parser
        raise AssertionError("unreachable")  # pragma: no cover

    def _acquire(
        self, origin: tuple[str, int], timeouts: dict[str, float | None]
    ) -> tuple[_SyncConnection, bool]:
        pool_timeout = timeouts.get("pool")
        deadline = None if pool_timeout is None else time.monotonic() + pool_timeout
        with self._cond:
            while True:
                idle = self._idle.get(origin)
                now = time.monotonic()
                while idle:
                    conn = idle.pop()
                    if self._expiry is None or now - conn.idle_since < self._expiry:
                        return conn, True
                    self._drop(conn)
                if self._open < self._max or self._evict_other(origin):
                    self._open += 1
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise httpx.PoolTimeout(f"no free connection within {pool_timeout:g} s")
                self._cond.wait(left)
        try:
            sock = socket.create_connection(origin, timeout=timeouts.get("connect"))
        except TimeoutError:
            self._forget()
            connect = timeouts.get("connect")
            raise httpx.ConnectTimeout(
                f"connecting to {origin[0]}:{origin[1]} took over {connect:g} s"
            ) from None
        except OSError as exc:
            self._forget()
            raise _connect_error(exc, origin) from exc
        except BaseException:
            self._forget()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _SyncConnection(origin, sock), False

    def _forget(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def _release(self, conn: _SyncConnection, keep: bool) -> None:
        with self._cond:
            idle = self._idle.setdefault(conn.origin, [])
            if keep and (self._max_idle is None or len(idle) < self._max_idle):
                conn.idle_since = time.monotonic()
                idle.append(conn)
            else:
                self._drop(conn)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._drop_idle()
        if self._fallback is not None:
            self._fallback.close()
