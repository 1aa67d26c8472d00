"""Run ``esp serve`` (or any HTTP process) on a loopback port: for tests and benchmarks.

One harness instead of one per caller: :func:`start_server` launches
``python -m esp_retrieval.cli serve`` on a free port in a subprocess (settings as ``ESP_*``
variables, inherited ``ESP_*`` removed so the caller's shell cannot leak into a test), waits
until ``/readyz`` answers 200 and returns a :class:`LiveServer`; :func:`spawn` starts any other
process (Prometheus, a bare uvicorn app) the same way. Output goes to a log file, quoted when a
wait fails; ``stop()`` terminates, then kills. The child finds this checkout first on its
``PYTHONPATH``, so it serves the code the caller imported, whatever its working directory.

    with start_server(bundle, tmp / "server.log", settings={"backend": "numpy"}) as server:
        httpx.post(f"{server.url}/v1/search", json=...)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

#: This checkout's root, the folder holding its ``esp_retrieval`` package.
SOURCE_ROOT = Path(__file__).resolve().parent.parent


#: a checkout's code folder -> the ``-m`` module of its ``esp`` command: today's, then the one from
#: before the one-package layout (docs/architecture.md, section 2)
CLI_MODULES = {"esp_retrieval": "esp_retrieval.cli", "esp_cli": "esp_cli"}


def cli_module(checkout: str | Path | None = None) -> str:
    """The ``-m`` module of the ``esp`` command in ``checkout`` (default: this one)."""
    root = SOURCE_ROOT if checkout is None else Path(checkout)
    return next((m for d, m in CLI_MODULES.items() if (root / d).is_dir()), CLI_MODULES["esp_retrieval"])


LOOPBACK = "127.0.0.1"
LOG_TAIL = 3000
#: While this variable is set, :func:`spawn` refuses to start anything and raises with its value.
#: The test suite sets it around every test without the ``live`` marker (tests/conftest.py), and
#: the processes those tests start inherit it.
REFUSE_ENV = "LIVE_SERVER_REFUSED"


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on right now (the OS picks it; a tiny race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``ESP_*``, with unbuffered output and this checkout
    first on ``PYTHONPATH``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESP_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


@dataclass
class LiveProcess:
    """A started process answering HTTP at ``url``, its stdout and stderr in ``log_path``."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self, tail: int | None = None) -> str:
        """The process's output so far (the last ``tail`` characters when given)."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return text[-tail:] if tail else text

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
        """Poll ``check`` (transport errors count as false) until true. ``RuntimeError`` when the
        process exits first, ``TimeoutError`` after ``timeout`` s; both quote the log's tail."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log(LOG_TAIL)}")
            try:
                if check():
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                tail = self.log(LOG_TAIL)
                raise TimeoutError(f"{self.name}: {what} not true after {timeout:.0f}s:\n{tail}")
            time.sleep(interval)

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate (SIGTERM: uvicorn shuts down gracefully), kill after ``timeout`` s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> LiveProcess:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class LiveServer(LiveProcess):
    """A running ``esp serve``: the bundle it was started on (a directory, or a URI) and its
    admin token, if any."""

    bundle: Path | str
    token: str | None = None

    def __enter__(self) -> LiveServer:
        return self


def spawn(
    name: str,
    cmd: Sequence[str],
    log_path: Path,
    url: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> LiveProcess:
    """Start ``cmd`` with its output in ``log_path`` (folder created); it must serve ``url``.
    ``env``: the whole environment (default: this process's); ``cwd``: default ``log_path``'s
    folder, so nothing it writes lands in the caller's working directory.
    ``RuntimeError`` while :data:`REFUSE_ENV` is set."""
    if refused := os.environ.get(REFUSE_ENV):
        raise RuntimeError(f"{name} not started: {refused}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env) if env is not None else None,
            cwd=cwd or log_path.parent,
        )
    return LiveProcess(name, url, proc, log_path)


def start_server(
    bundle: Path | str,
    log_path: Path,
    *,
    settings: Mapping[str, object] | None = None,
    token: str | None = None,
    registry: Path | None = None,
    args: Sequence[str] = (),
    ready_timeout: float = 90.0,
    pythonpath: Path | None = None,
    wrapper: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> LiveServer:
    """``esp serve --bundle bundle`` on a free loopback port; returns once ``/readyz`` is 200.
    ``bundle``: a directory, or a URI string (``http://...``: give ``bundle_sha256`` in ``settings``).

    ``settings``: name -> value, passed as ``ESP_<NAME>`` (``None`` values left out, so the
    service default applies); ``token``: ``ESP_ADMIN_TOKEN``; ``registry``: ``ESP_REGISTRY``;
    ``args``: extra ``esp serve`` arguments (``--no-batching``, ``--log-level warning``, ...);
    ``pythonpath``: serve the code of that checkout instead of this one (first on ``PYTHONPATH``);
    ``wrapper``: a command the server runs under (``setpriv --reuid=65534 ...``: another uid);
    ``env``: other environment variables (``HOME`` for such a uid).
    Stops the server and raises, quoting its log, when it exits or is not ready in time.
    """
    port = free_port()
    extra = {f"ESP_{k.upper()}": str(v) for k, v in (settings or {}).items() if v is not None}
    extra.update(env or {})
    if token is not None:
        extra["ESP_ADMIN_TOKEN"] = token
    if registry is not None:
        extra["ESP_REGISTRY"] = str(Path(registry).absolute())
    ref = bundle if isinstance(bundle, str) and "://" in bundle else str(Path(bundle).absolute())
    cmd = [*wrapper, sys.executable, "-m", cli_module(pythonpath), "serve", "--bundle", ref,
           "--host", LOOPBACK, "--port", str(port), *args]
    if pythonpath is not None:
        extra["PYTHONPATH"] = str(Path(pythonpath).absolute())
    started = spawn("esp-serve", cmd, log_path, f"http://{LOOPBACK}:{port}", env=child_env(extra))
    server = LiveServer(started.name, started.url, started.proc, started.log_path, bundle, token)
    try:
        server.wait_until(
            lambda: httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200,
            ready_timeout, "/readyz == 200",
        )
    except BaseException:
        server.stop()
        raise
    return server


def start_milvus_lite(db: Path, log_path: Path, *, ready_timeout: float = 120.0) -> LiveProcess:
    """``esp milvus-lite db`` on a free loopback port (one Milvus Lite file that several processes
    share); returns once it has printed its URI (``url``: the ``ESP_MILVUS_URI`` of its clients)."""
    port = free_port()
    cmd = [sys.executable, "-m", cli_module(), "milvus-lite", str(Path(db).absolute()),
           "--host", LOOPBACK, "--port", str(port)]
    started = spawn("esp-milvus-lite", cmd, log_path, f"http://{LOOPBACK}:{port}", env=child_env())
    try:
        started.wait_until(lambda: '"uri"' in started.log(), ready_timeout, "its URI printed")
    except BaseException:
        started.stop()
        raise
    return started
