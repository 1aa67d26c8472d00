"""HTTP-level limits on the real server (esp serve, httptools): header size and count, header and
body read timeouts, and a lingering close so a client still sending reads its 413."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlparse

import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

LAYOUT = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
WAIT = 20.0  # socket timeout: far above the 1 s limits under test, so only a missing answer trips it
TOKEN = "http-limits-admin-token"
MAX_HEAD = 8192  # the server's max_header_bytes below


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory, module_server_factory: Callable[..., LiveServer]
) -> LiveServer:
    emb = normalize_blocks(np.random.default_rng(0).standard_normal((200, 32)).astype(np.float32), LAYOUT)
    bundle = write_bundle(tmp_path_factory.mktemp("http") / "b", LAYOUT, emb, [f"d{i}" for i in range(200)])
    return module_server_factory(
        bundle,
        token=TOKEN,
        max_body_bytes=65536,
        max_header_bytes=MAX_HEAD,
        max_headers=50,
        header_timeout_seconds=1,
        body_timeout_seconds=1,
        linger_seconds=5,
    )


def _exchange(server: LiveServer, data: bytes) -> bytes:
    """Send ``data``, read until the server closes; what it answered."""
    url = urlparse(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=WAIT) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_oversized_headers_are_431_and_the_connection_closes(limited: LiveServer) -> None:
    answer = _exchange(limited, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n")
    assert _status(answer) == 431
    assert b"8192 bytes" in answer and b"connection: close" in answer.lower()


def test_too_many_header_fields_are_431(limited: LiveServer) -> None:
    fields = b"".join(b"X-F%d: 1\r\n" % i for i in range(80))
    answer = _exchange(limited, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert _status(answer) == 431 and b"more than 50 header fields" in answer
    assert b'"type": "request_header_fields_too_large"' in answer  # the kind of its status (one table)


def test_headers_never_completed_get_408_and_a_close(limited: LiveServer) -> None:
    answer = _exchange(limited, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
    assert _status(answer) == 408 and b"headers not received" in answer
    assert b'"type": "request_timeout"' in answer


def test_a_body_shorter_than_its_content_length_gets_408(limited: LiveServer) -> None:
    head = b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    answer = _exchange(limited, head + b'{"queries"')
    assert _status(answer) == 408 and b"request body not received" in answer
    assert b'"type": "request_timeout"' in answer


def test_a_second_request_whose_headers_stall_gets_408(limited: LiveServer) -> None:
    # the head timer runs per request, not only from the connection's start
    first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    url = urlparse(limited.url)
    with socket.create_connection((url.hostname, url.port), timeout=WAIT) as s:
        s.sendall(first)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.6)
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # started, then stalled: 1 s from these bytes
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert _status(out) == 408 and b"headers not received" in out


def test_a_body_that_keeps_arriving_is_not_timed_out(limited: LiveServer) -> None:
    # the body timeout counts silence: each chunk within it restarts it, however long the whole takes
    body = b'{"queries": [{"vector": [' + b", ".join(b"0.5" for _ in range(32)) + b']}], "k": 3}'
    head = (b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    url = urlparse(limited.url)
    with socket.create_connection((url.hostname, url.port), timeout=WAIT) as s:
        s.sendall(head + body[:10])
        for start in range(10, len(body), 60):
            time.sleep(0.4)
            s.sendall(body[start : start + 60])
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert _status(out) == 200, out[-300:]


def test_a_client_that_sends_its_whole_oversized_body_reads_the_413(limited: LiveServer) -> None:
    request = urllib.request.Request(  # urllib sends everything (Connection: close) before reading
        f"{limited.url}/v1/search", data=b"x" * 4_000_000, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=WAIT)
    assert err.value.code == 413
    assert b"larger than the limit of 65536 bytes" in err.value.read()


def test_a_body_past_64_mib_sent_whole_before_reading_still_reads_the_413(limited: LiveServer) -> None:
    # the lingering close drops what still arrives for its time, not up to a byte count: a client
    # that sends 80 MiB before it reads (no reset, no EPIPE on its send) reads the 413
    size = 80 * 1024 * 1024
    head = (b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % size)
    answer = _exchange(limited, head + b"x" * size)
    assert _status(answer) == 413 and b"larger than the limit of 65536 bytes" in answer


def test_keep_alive_requests_within_the_limits_are_served(limited: LiveServer) -> None:
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _exchange(limited, one + one + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 3


def test_past_the_connection_limit_the_answer_is_503_with_retry_after(
    tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., LiveServer]
) -> None:
    emb = normalize_blocks(np.random.default_rng(1).standard_normal((50, 32)).astype(np.float32), LAYOUT)
    bundle = write_bundle(tmp_path_factory.mktemp("conn") / "b", LAYOUT, emb, [f"d{i}" for i in range(50)])
    server = server_factory(bundle, max_connections=2)
    url = urlparse(server.url)
    # the readiness polls' connections are closed, but a busy server may not have seen them go
    # yet: until it has, even the first of our two is past the limit; ask again until it is not
    deadline = time.monotonic() + WAIT
    while True:
        a = socket.create_connection((url.hostname, url.port), timeout=WAIT)
        a.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = a.recv(65536)
        if first.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
            break
        a.close()
        time.sleep(0.1)
    with a, socket.create_connection((url.hostname, url.port), timeout=WAIT) as b:
        assert first.startswith(b"HTTP/1.1 200"), first
        b.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # a third connection is refused below
        b.recv(65536)
        answer = _exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _status(answer) == 503
    assert b"retry-after: 1" in answer.lower() and b'"type": "not_ready"' in answer


def test_an_unparsable_request_gets_the_error_body(limited: LiveServer) -> None:
    answer = _exchange(limited, b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    assert _status(answer) == 400
    assert b'"type": "bad_request"' in answer and b"invalid HTTP request" in answer


def _head(size: int, first_lines: bytes) -> bytes:
    """A request line and headers of exactly ``size`` bytes (blank line included): ``first_lines``
    (CRLF-terminated) and an ``X-Pad`` header that fills the rest."""
    head = first_lines + b"X-Pad: \r\n\r\n"
    pad = size - len(head)
    assert pad >= 0
    return first_lines + b"X-Pad: " + b"a" * pad + b"\r\n\r\n"


def _reloads(server: LiveServer) -> float:
    """``esp_bundle_reloads_total{result="success"}`` as the server counts it now."""
    metrics = urllib.request.urlopen(f"{server.url}/metrics", timeout=WAIT).read().decode()
    line = next((m for m in metrics.splitlines() if m.startswith('esp_bundle_reloads_total{result="success"}')), None)
    return 0.0 if line is None else float(line.rsplit(" ", 1)[1])


def test_a_head_past_the_limit_by_one_byte_is_431_and_never_executed(limited: LiveServer) -> None:
    # the head ends on the byte after the limit: it is refused before its request runs (an admin
    # reload ran and was answered 431 both); exactly at the limit it is served. Reloads run one at
    # a time, in order, so once the second is answered a first that ran would be counted too.
    reload = b"POST /v1/admin/reload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % TOKEN.encode()
    reload += b"Content-Length: 0\r\nConnection: close\r\n"
    before = _reloads(limited)
    answer = _exchange(limited, _head(MAX_HEAD + 1, reload))
    assert _status(answer) == 431 and answer.count(b"HTTP/1.1") == 1, answer[:300]
    answer = _exchange(limited, _head(MAX_HEAD, reload))
    assert _status(answer) == 200, answer[-300:]
    assert _reloads(limited) == before + 1  # only the second ran


def test_a_search_whose_head_is_one_byte_too_long_is_not_answered_200(limited: LiveServer) -> None:
    body = b'{"queries": [{"vector": [' + b", ".join(b"0.5" for _ in range(32)) + b']}], "k": 3}'
    lines = (b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Connection: close\r\nContent-Length: %d\r\n" % len(body))
    answer = _exchange(limited, _head(MAX_HEAD + 1, lines) + body)  # head and body in one send
    assert _status(answer) == 431 and answer.count(b"HTTP/1.1") == 1, answer[:300]
    answer = _exchange(limited, _head(MAX_HEAD, lines) + body)
    assert _status(answer) == 200, answer[-300:]
