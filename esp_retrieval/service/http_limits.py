"""HTTP-level limits for uvicorn's httptools protocol: header size and count, header and body read
timeouts, and a bounded lingering close.

uvicorn bounds none of these on its httptools parser: a request line plus headers may grow
without limit (the parser buffers a header value until it ends), a client that sends headers or
a body slowly, or declares a ``Content-Length`` it never sends, holds its connection (and the
request task waiting on the body) indefinitely, and a connection closed right after an early
answer (413 before the body was read) is reset by the kernel, so a client still sending never
reads the answer. :class:`LimitedHttpToolsProtocol` adds, per connection:

- ``max_header_bytes`` (request line + headers) and ``max_headers`` (fields): 431, then close;
- ``header_timeout_seconds`` from the first byte of a request (or from the connection's start)
  until its headers are complete: 408, then close;
- ``body_timeout_seconds`` of silence while a body is still expected (reading paused because
  the app has not consumed it yet does not count): 408 when nothing was answered yet, then close;
- a lingering close whenever the connection is closed while the request body is still arriving
  (413 answered early, 408, 431): the write side is shut (the answer is followed by FIN, not
  RST) and what the client still sends is read and dropped for up to ``linger_seconds``, so
  every client reads its answer. Time is the only bound: a client that sends its whole body
  before reading (however large: a byte count would reset a 64 MiB upload) and finishes within
  it reads its 413; one still sending after it is reset.

It also stamps each request's scope with when its headers were complete
(:data:`RECEIVED`, ``time.monotonic()``), so admission can count the time a request already
waited for the event loop (:class:`esp_retrieval.service.search.admission.AdmissionMiddleware`), and answers
uvicorn's connection/concurrency limit (``limit_concurrency``) with the service's error body and
``Retry-After`` instead of a bare 503.

Settings come from the environment (:func:`esp_retrieval.service.config.get_settings`, what ``esp serve``
sets), so the class can be named by its import string (``uvicorn --http
esp_retrieval.service.http_limits:LimitedHttpToolsProtocol``), which worker processes can import too.
Keep-alive and concurrency limits are uvicorn's own options (``timeout_keep_alive``,
``limit_concurrency``), set by ``esp serve`` from the same settings.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from esp_retrieval.service.config import Settings, get_settings
from esp_retrieval.service.errors import STATUS, ErrorKind, encoded_error, send_error

#: Scope key: ``time.monotonic()`` when the request's headers were complete.
RECEIVED = "esp.received"
#: Scope key, set True when the app's :data:`HEAD_ADMISSION` check let the request through.
ADMITTED_AT_HEAD = "esp.admitted_at_head"
#: Lifespan-state key (the app's lifespan yields it; uvicorn hands the state to each protocol):
#: a check made at a request's headers, ``(method, target, header fields, received) -> answer or
#: None`` (:class:`service.search.admission.HeadAdmission`). An answer (status, headers, body) is
#: written when the request's body has been read and dropped, and no app runs for it.
HEAD_ADMISSION = "esp.head_admission"

#: An answer written by the protocol itself: status, header fields, body.
EarlyAnswer = tuple[int, list[tuple[bytes, bytes]], bytes]


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer past ``limit_concurrency``: 503, the error body, ``Retry-After: 1``."""
    message = "too many connections or requests in progress; retry shortly"
    await send_error(send, ErrorKind.NOT_READY, message, headers=[(b"retry-after", b"1")])


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int
    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    linger: float

    @classmethod
    def from_settings(cls, s: Settings) -> HttpLimits:
        return cls(
            s.max_body_bytes,
            s.max_header_bytes,
            s.max_headers,
            s.header_timeout_seconds,
            s.body_timeout_seconds,
            s.linger_seconds,
        )


class _Rejected(Exception):  # noqa: N818 - raised out of a parser callback, caught in data_received
    pass


class _LingeringTransport:
    """The connection's transport as the request cycle sees it: ``close`` lingers while the
    request body is still arriving; everything else is the transport's."""

    def __init__(self, protocol: LimitedHttpToolsProtocol, transport: asyncio.Transport) -> None:
        self._protocol = protocol
        self._transport = transport

    def close(self) -> None:
        self._protocol.close_lingering()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module doc."""

    limits: ClassVar[HttpLimits | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cls = type(self)
        if cls.limits is None:
            cls.limits = HttpLimits.from_settings(get_settings())
        self._limits: HttpLimits = cls.limits
        self._in_head = True  # the bytes that come next belong to a request line and headers
        self._head_bytes = 0
        self._heads_done = 0  # request heads completed on this connection
        self._header_count = 0
        self._rejection: tuple[ErrorKind, str] | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._body_pending = False  # headers complete, body not yet
        self._early: EarlyAnswer | None = None  # answered at the head: the body is dropped, then this written
        self._concurrency, self.limit_concurrency = self.limit_concurrency, None  # checked here

    # --- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._body_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # dropped: the linger timer ends the connection
        self._unset_keepalive_if_required()
        if self._in_head:
            room = self._limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Only the bytes within the limit reach the parser: a head that has not ended
                # among them is refused before its request exists (431, nothing dispatched).
                # Counting completed heads, not reading ``_in_head``, tells "ended within the
                # limit" apart from "ended, and its whole message too" (which sets it again).
                heads = self._heads_done
                if not self._feed(data[:room]) or self._lingering:
                    return
                if self._heads_done == heads:
                    limit = self._limits.max_header_bytes
                    message = f"request line and headers exceed {limit} bytes"
                    self._reject(ErrorKind.HEADERS_TOO_LARGE, message)
                    return
                self._feed(data[room:])
                self._arm_pending_timer()
                return
            self._head_bytes += len(data)
        if self._feed(data):
            self._arm_pending_timer()

    def _arm_pending_timer(self) -> None:
        """A timer for the request these bytes left incomplete, if any: the head's from its
        first bytes, the body's anew on each. A request that arrived whole (the common case:
        head and body in one read) arms none."""
        if self._lingering or self.transport.is_closing():
            return
        if self._in_head:
            if self._head_bytes and self._head_timer is None:
                self._arm_head_timer()
        elif self._body_pending:
            self._arm_body_timer()

    def _feed(self, data: bytes) -> bool:
        """Feed the parser; ``False`` when the connection was answered with an error."""
        if not data:
            return True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError:
            if self._rejection is not None:
                kind, message = self._rejection
                self._reject(kind, message)
            else:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return False
        return True

    # --- parser callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._limits.max_headers:
            message = f"more than {self._limits.max_headers} header fields"
            self._rejection = (ErrorKind.HEADERS_TOO_LARGE, message)
            raise _Rejected
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        self._cancel(self._head_timer)
        self._head_timer = None
        received = self.scope[RECEIVED] = time.monotonic()  # type: ignore[literal-required]
        limit = self._concurrency
        busy = limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)
        if not busy and self._answered_at_head(received):
            self._body_pending = True
            return
        app = self.app
        if busy:
            self.logger.warning("Exceeded concurrency limit.")
            self.app = _busy
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        if self.cycle is not None and not isinstance(self.cycle.transport, _LingeringTransport):
            self.cycle.transport = _LingeringTransport(self, self.transport)  # type: ignore[assignment]
        self._body_pending = True

    def _answered_at_head(self, received: float) -> bool:
        """Whether the app's :data:`HEAD_ADMISSION` check answered this request at its headers.
        Asked only where writing the answer once the body is read keeps the order and the
        limits: no request in progress on the connection (pipelining), no ``Expect:
        100-continue`` (the client waits for a go-ahead before its body), and a declared body
        within ``ESP_MAX_BODY_BYTES`` (a larger one gets the body limit's 413; a chunked one is
        counted by the app)."""
        check = self.app_state.get(HEAD_ADMISSION)
        if check is None or self.expect_100_continue:
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False
        length = next((value for name, value in self.headers if name == b"content-length"), None)
        if length is None or not length.isdigit() or int(length) > self._limits.max_body_bytes:
            return False
        answer = check(self.parser.get_method(), self.url, self.headers, received)
        if answer is None:
            self.scope[ADMITTED_AT_HEAD] = True  # type: ignore[literal-required]
            return False
        self._early = answer
        return True

    def on_body(self, body: bytes) -> None:
        if self._early is None:
            super().on_body(body)  # else dropped: the request was answered at its head

    def on_message_complete(self) -> None:
        early, self._early = self._early, None
        if early is None:
            super().on_message_complete()
        self._body_pending = False
        self._cancel(self._body_timer)
        self._body_timer = None
        self._in_head = True
        self._head_bytes = 0
        if early is not None:
            self._write_early(early)

    def _write_early(self, answer: EarlyAnswer) -> None:
        """Write an answer made at the head (its body now read); keep-alive as the client asked."""
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        status, headers, payload = answer
        self._write(status, headers if keep_alive else [*headers, (b"connection", b"close")], payload)
        if keep_alive:
            self.on_response_complete()  # the keep-alive timer, pipelined requests, reading resumed
        else:
            self.server_state.total_requests += 1
            self._transport_close()

    # --- timers ----------------------------------------------------------------------------
    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def _arm_head_timer(self) -> None:
        self._cancel(self._head_timer)
        self._head_timer = self.loop.call_later(self._limits.header_timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing() and not self._lingering:
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is still being answered (pipelining); its own timers apply
            if self._head_bytes == 0 and self.cycle is not None:
                self.transport.close()  # an idle keep-alive connection: nothing to answer
                return
            message = f"request headers not received within {self._limits.header_timeout:g} s"
            self._reject(ErrorKind.REQUEST_TIMEOUT, message)

    def _arm_body_timer(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = self.loop.call_later(self._limits.body_timeout, self._body_timed_out)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._body_pending or self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:
            self._arm_body_timer()  # the app has not read what was sent: not the client's silence
            return
        cycle = self.cycle
        message = f"request body not received: nothing sent for {self._limits.body_timeout:g} s"
        if self._early is not None:  # answered at its head, its body never came: the 408 instead
            self._early = None
            self._write_error(ErrorKind.REQUEST_TIMEOUT, message)
        elif cycle is not None and not cycle.response_started:
            self._write_error(ErrorKind.REQUEST_TIMEOUT, message)
        if cycle is not None:
            cycle.disconnected = True  # the app's receive() answers http.disconnect
            cycle.message_event.set()
        self._transport_close()

    # --- answers and closing -----------------------------------------------------------------
    def _write_error(self, kind: ErrorKind, message: str) -> None:
        """The error answered on the connection itself (no app ran): :func:`service.errors.encoded_error`."""
        self._write(*encoded_error(kind, message, close=True))

    def _write(self, status: int, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
        head = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, *headers]:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend([b"\r\n", payload])
        self.transport.write(b"".join(head))

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read: the service's error body (not uvicorn's plain text)."""
        message = f"invalid HTTP request (request line, headers or chunked body): {msg}"
        self._write_error(ErrorKind.BAD_REQUEST, message)
        self.close_lingering(force=True)

    def _reject(self, kind: ErrorKind, message: str) -> None:
        """Answer ``kind`` (431, 408) before the app ran, then close lingering."""
        self._rejection = None
        self.logger.warning("HTTP %d: %s", STATUS[kind], message)
        self._write_error(kind, message)
        self.close_lingering(force=True)

    def close_lingering(self, force: bool = False) -> None:
        """Close; if the client may still be sending the request, shut the write side first and
        drop what arrives for up to ``linger_seconds``, so it reads the answer (no reset)."""
        if self.transport.is_closing():
            return
        still_sending = force or self._body_pending
        if not still_sending or self._limits.linger <= 0 or not self.transport.can_write_eof():
            self._transport_close()
            return
        self._lingering = True
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._unset_keepalive_if_required()
        self.transport.write_eof()
        if self.flow is not None:
            self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(self._limits.linger, self._transport_close)

    def _transport_close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        if self._lingering:
            self.server_state.total_requests += 1
            return
        super().on_response_complete()
