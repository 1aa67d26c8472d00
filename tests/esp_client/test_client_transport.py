"""esp_client/transport.py: HTTP/1.1 framing, keep-alive, retries, timeouts and the pool limit.

A scripted loopback server (one thread per connection) answers each request with what the test
says and records the connections and the raw requests it saw.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from esp_client.transport import AsyncHTTP11Transport, HTTP11Transport, ResponseParser, origin_of

# -- the parser ------------------------------------------------------------------------------------


def _parse(raw: bytes, *, head_only: bool = False, piece: int = 0, eof: bool = False) -> ResponseParser:
    p = ResponseParser(head_only)
    pieces = [raw[i : i + piece] for i in range(0, len(raw), piece)] if piece else [raw]
    done = False
    for chunk in pieces:
        done = p.feed(chunk)
    if eof and not done:
        p.eof()
    return p


@pytest.mark.parametrize("piece", [0, 1, 7])
def test_content_length_body_in_any_split(piece: int) -> None:
    p = _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello", piece=piece)
    assert p.done and p.keep_alive
    assert (p.status, p.reason) == (200, b"OK")
    assert p.headers == [(b"Content-Length", b"5"), (b"X-A", b"b")]
    assert p.response().read() == b"hello"


@pytest.mark.parametrize("piece", [0, 1, 5])
def test_chunked_body_with_extensions_and_trailers(piece: int) -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n"
    p = _parse(raw, piece=piece)
    assert p.done and p.keep_alive
    assert p.response().read() == b"hello world"


def test_body_until_close_ends_with_the_connection() -> None:
    p = _parse(b"HTTP/1.1 200 OK\r\n\r\npart one, ", piece=4)
    assert not p.done and not p.keep_alive
    p.feed(b"part two")
    p.eof()
    assert p.done
    assert p.response().read() == b"part one, part two"


def test_informational_answers_are_skipped() -> None:
    p = _parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
    assert (p.status, p.response().read()) == (201, b"ok")


@pytest.mark.parametrize(
    ("raw", "head_only"),
    [
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", True),
    ],
)
def test_answers_without_a_body(raw: bytes, head_only: bool) -> None:
    p = _parse(raw, head_only=head_only)
    assert p.done and p.keep_alive
    assert p.response().read() == b""


@pytest.mark.parametrize(
    ("raw", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
    ],
)
def test_connection_reuse_follows_version_and_connection_header(raw: bytes, keep_alive: bool) -> None:
    assert _parse(raw).keep_alive is keep_alive


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"SPDY/3 200 OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    ],
)
def test_malformed_answers_raise_remote_protocol_error(raw: bytes, message: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match=message):
        _parse(raw)


def test_a_cut_answer_is_an_error_and_names_what_is_missing() -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        ResponseParser(False).eof()
    with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
        _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf", eof=True)


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://bücher.example/x", ("xn--bcher-kva.example", 80)),
        ("http://[::1]:8080/", ("::1", 8080)),
        ("http://127.0.0.1:9/", ("127.0.0.1", 9)),
    ],
)
def test_origin_is_what_to_connect_to(url: str, origin: tuple[str, int]) -> None:
    assert origin_of(httpx.URL(url)) == origin


# -- a scripted server ----------------------------------------------------------------------------


@dataclass
class Seen:
    """One request as the server read it."""

    conn: int
    head: bytes
    body: bytes


Reply = Callable[[int, Seen], bytes | None]  # (request number, request) -> answer; None: close


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


@dataclass
class Scripted:
    reply: Reply
    delay: float = 0.0  # seconds before each answer
    close_after_answer: bool = False  # close every connection once it answered (idle close)
    gap: float = 0.0  # send each answer in 4 pieces, this many seconds apart
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    live: int = 0
    max_live: int = 0
    sock: socket.socket = field(default_factory=socket.socket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn, self.connections), daemon=True).start()

    def _handle(self, conn: socket.socket, number: int) -> None:
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                chunked = b"transfer-encoding: chunked" in head.lower()
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                end = b"0\r\n\r\n" if chunked else None
                while (end is not None and not buf.endswith(end)) or len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = (buf, b"") if chunked else (buf[:length], buf[length:])
                seen = Seen(number, head, body)
                self.seen.append(seen)
                answer = self.reply(len(self.seen), seen)
                time.sleep(self.delay)
                if answer is None:
                    return
                if self.gap:
                    step = -(-len(answer) // 4)
                    for i in range(0, len(answer), step):
                        time.sleep(self.gap if i else 0)
                        conn.sendall(answer[i : i + step])
                else:
                    conn.sendall(answer)
                if self.close_after_answer:
                    return
        except OSError:
            return
        finally:
            self.live -= 1
            conn.close()


def scripted_servers() -> Iterator[Callable[..., Scripted]]:
    """The ``scripted`` fixture's body: ``make(reply, **options)`` starts a server; all close after."""
    servers: list[Scripted] = []

    def make(reply: Reply = lambda n, s: ok(), **kw: object) -> Scripted:
        srv = Scripted(reply, **kw)  # type: ignore[arg-type]
        srv.sock.bind(("127.0.0.1", 0))
        srv.sock.listen(64)
        threading.Thread(target=srv.serve, daemon=True).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.sock.close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    yield from scripted_servers()


def sync_client(srv: Scripted, **kw: object) -> httpx.Client:
    limits = kw.pop("limits", None)
    return httpx.Client(base_url=srv.url, transport=HTTP11Transport(limits), **kw)  # type: ignore[arg-type]


def async_client(srv: Scripted, **kw: object) -> httpx.AsyncClient:
    limits = kw.pop("limits", None)
    return httpx.AsyncClient(base_url=srv.url, transport=AsyncHTTP11Transport(limits), **kw)  # type: ignore[arg-type]


# -- both transports ------------------------------------------------------------------------------


def test_request_goes_out_as_one_well_formed_message(scripted: Callable[..., Scripted]) -> None:
    srv = scripted()
    with sync_client(srv) as c:
        r = c.post("/v1/search", params={"a": "b c"}, content=b'{"q":1}', headers={"content-type": "x/y"})
    assert r.status_code == 200 and r.json() == {"ok": True}
    head = srv.seen[0].head.split(b"\r\n")
    assert head[0] == b"POST /v1/search?a=b+c HTTP/1.1"
    assert f"Host: {srv.url.removeprefix('http://')}".encode() in head
    assert b"Content-Length: 7" in head and b"content-type: x/y" in head
    assert srv.seen[0].body == b'{"q":1}'


def test_sync_keep_alive_reuses_one_connection(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(b"%d" % n))
    with sync_client(srv) as c:
        assert [c.get("/").text for _ in range(5)] == ["1", "2", "3", "4", "5"]
    assert srv.connections == 1


@pytest.mark.asyncio
async def test_async_keep_alive_reuses_one_connection(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(b"%d" % n))
    async with async_client(srv) as c:
        assert [(await c.get("/")).text for _ in range(5)] == ["1", "2", "3", "4", "5"]
    assert srv.connections == 1


def test_sync_connection_close_opens_a_new_connection(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(extra=b"Connection: close\r\n"))
    with sync_client(srv) as c:
        for _ in range(3):
            assert c.get("/").status_code == 200
    assert srv.connections == 3


@pytest.mark.parametrize("idle_close", [True, False])
def test_sync_stale_idle_connection_is_retried_once_on_a_new_one(
    scripted: Callable[..., Scripted], idle_close: bool
) -> None:
    """The server drops a kept-alive connection (idle close, or after reading the request):
    the request goes out again on a new connection and succeeds."""
    drop = {2}
    srv = scripted(
        (lambda n, s: ok(b"%d" % n)) if idle_close else (lambda n, s: None if n in drop else ok(b"%d" % n)),
        close_after_answer=idle_close,
    )
    with sync_client(srv) as c:
        first = c.get("/").text
        time.sleep(0.05)  # the server has closed the idle connection by now
        second = c.get("/").text
    assert first == "1"
    assert second == "2" if idle_close else second == "3"
    assert srv.connections == 2


@pytest.mark.parametrize("idle_close", [True, False])
@pytest.mark.asyncio
async def test_async_stale_idle_connection_is_retried_once_on_a_new_one(
    scripted: Callable[..., Scripted], idle_close: bool
) -> None:
    drop = {2}
    srv = scripted(
        (lambda n, s: ok(b"%d" % n)) if idle_close else (lambda n, s: None if n in drop else ok(b"%d" % n)),
        close_after_answer=idle_close,
    )
    async with async_client(srv) as c:
        first = (await c.get("/")).text
        await asyncio.sleep(0.05)
        second = (await c.get("/")).text
    assert first == "1"
    assert second == "2" if idle_close else second == "3"
    assert srv.connections == 2


def test_sync_fresh_connection_closed_without_answer_is_not_retried(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda n, s: None)
    with sync_client(srv) as c, pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        c.get("/")
    assert len(srv.seen) == 1


@pytest.mark.asyncio
async def test_async_fresh_connection_closed_without_answer_is_not_retried(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda n, s: None)
    async with async_client(srv) as c:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await c.get("/")
    assert len(srv.seen) == 1


def test_sync_read_timeout(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(delay=1.0)
    with sync_client(srv, timeout=0.2) as c, pytest.raises(httpx.ReadTimeout):
        c.get("/")


@pytest.mark.asyncio
async def test_async_read_timeout_and_the_connection_is_not_reused(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(b"%d" % n), delay=0.5)
    async with async_client(srv, timeout=0.2) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get("/")
        r = await c.get("/", timeout=5)  # the late answer to the first request must not be read here
    assert r.text == "2"
    assert srv.connections == 2


@pytest.mark.parametrize("transport", ["sync", "async"])
def test_read_timeout_is_between_bytes_not_for_the_whole_answer(
    scripted: Callable[..., Scripted], transport: str
) -> None:
    """Pieces 0.15 s apart (0.45 s in all) under a 0.3 s read timeout: answered."""
    srv = scripted(lambda n, s: ok(b"x" * 64), gap=0.15)
    if transport == "sync":
        with sync_client(srv, timeout=0.3) as c:
            assert c.get("/").text == "x" * 64

    async def go() -> str:
        async with async_client(srv, timeout=0.3) as ac:
            return (await ac.get("/")).text

    if transport == "async":
        assert asyncio.run(go()) == "x" * 64


@pytest.mark.asyncio
async def test_async_read_timeout_after_earlier_fast_answers(scripted: Callable[..., Scripted]) -> None:
    """The connection's timer, armed by the first request, still catches the third one hanging."""
    srv = scripted(lambda n, s: ok() if n < 3 else b"")  # the third gets no answer
    async with async_client(srv, timeout=0.3) as c:
        assert (await c.get("/")).status_code == 200
        await asyncio.sleep(0.2)
        assert (await c.get("/")).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            await c.get("/")
    assert srv.connections == 1


def test_async_transport_outlives_an_event_loop(scripted: Callable[..., Scripted]) -> None:
    """A client used under one asyncio.run, then another: the first loop's idle connection is let
    go (awaiting it under the new loop would fail) and a new one serves the request."""
    srv = scripted(lambda n, s: ok(b"%d" % n))
    client = httpx.AsyncClient(base_url=srv.url, transport=AsyncHTTP11Transport())

    async def get() -> str:
        return (await client.get("/")).text

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the first loop's transport, left to the GC
        assert asyncio.run(get()) == "1"
        assert asyncio.run(get()) == "2"
        asyncio.run(client.aclose())
    assert srv.connections == 2


def test_connect_refused_is_a_connect_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with httpx.Client(transport=HTTP11Transport()) as c, pytest.raises(httpx.ConnectError):
        c.get(f"http://127.0.0.1:{port}/")

    async def go() -> None:
        async with httpx.AsyncClient(transport=AsyncHTTP11Transport()) as ac:
            await ac.get(f"http://127.0.0.1:{port}/")

    with pytest.raises(httpx.ConnectError):
        asyncio.run(go())


@pytest.mark.asyncio
async def test_async_pool_never_exceeds_max_connections(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(s.body), delay=0.02)
    async with async_client(srv, limits=httpx.Limits(max_connections=2)) as c:
        answers = await asyncio.gather(*(c.post("/", content=b"%d" % i) for i in range(10)))
    assert [r.text for r in answers] == [str(i) for i in range(10)]
    assert srv.max_live <= 2
    assert srv.connections == 2


def test_sync_pool_is_shared_by_threads_within_the_limit(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(s.body), delay=0.02)
    out: dict[int, str] = {}
    with sync_client(srv, limits=httpx.Limits(max_connections=2)) as c:

        def one(i: int) -> None:
            out[i] = c.post("/", content=b"%d" % i).text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert out == {i: str(i) for i in range(6)}
    assert srv.max_live <= 2


@pytest.mark.asyncio
async def test_async_pool_timeout(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(delay=0.5)
    async with async_client(srv, limits=httpx.Limits(max_connections=1)) as c:
        slow = asyncio.create_task(c.get("/"))
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.PoolTimeout):
            await c.get("/", timeout=httpx.Timeout(5, pool=0.1))
        assert (await slow).status_code == 200


@pytest.mark.asyncio
async def test_async_cancelled_request_frees_its_connection(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(delay=0.3)
    async with async_client(srv, limits=httpx.Limits(max_connections=1)) as c:
        slow = asyncio.create_task(c.get("/"))
        await asyncio.sleep(0.1)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert (await c.get("/", timeout=5)).status_code == 200


def test_compressed_and_chunked_answers_are_decoded_by_httpx(scripted: Callable[..., Scripted]) -> None:
    packed = gzip.compress(b"x" * 1000)
    chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    srv = scripted(lambda n, s: head + chunks)
    with sync_client(srv) as c:
        assert c.get("/").text == "x" * 1000


@pytest.mark.asyncio
async def test_streamed_request_body_is_sent_chunked(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda n, s: ok(s.body))

    async def parts() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    async with async_client(srv) as c:
        r = await c.post("/", content=parts())
    assert b"Transfer-Encoding: chunked" in srv.seen[0].head
    assert r.content == b"4\r\nabcd\r\n0\r\n\r\n"


def test_https_goes_to_httpx_own_transport(scripted: Callable[..., Scripted]) -> None:
    """A TLS handshake against a plain-HTTP server fails in httpx's transport: not spoken as plain text."""
    srv = scripted()
    transport = HTTP11Transport()
    with (
        httpx.Client(transport=transport, timeout=0.5) as c,
        pytest.raises((httpx.ConnectError, httpx.ConnectTimeout)),
    ):
        c.get(srv.url.replace("http://", "https://") + "/")
    assert transport._fallback is not None
    assert srv.seen == []
