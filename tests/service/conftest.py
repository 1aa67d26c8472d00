"""Service fixtures: bundles built in the test, and the real server (uvicorn via ``esp serve``).

``start_server(bundle, **settings)`` launches ``python -m subspace.cli serve`` on a free
loopback port in a subprocess, waits for ``/readyz`` and returns a :class:`LiveServer`
(``url``, ``log()``, ``stop()``). ``served`` is one session-scoped server on a copy of the
tiny bundle (encoder + docs) with an admin token and a registry file holding an experiment;
tests that change what is served start their own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from subspace.bundle import read_bundle, write_bundle
from subspace.layout import SubspaceLayout
from subspace.scoring import normalize_blocks

REPO = Path(__file__).resolve().parents[2]

REGISTRY_DOC: dict[str, Any] = {
    "version": 1,
    "operating_points": {
        "semantic_heavy": {"weights": {"semantic": 1.0, "entity": 0.05, "intent": 0.05}},
        "entity_heavy_reg": {"weights": {"semantic": 0.05, "entity": 1.0, "intent": 0.05}},
    },
    "experiments": {
        "ent": {
            "salt": "ent-v1",
            "arms": [
                {"name": "control", "share": 0.5, "operating_point": "semantic_heavy"},
                {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy_reg"},
            ],
        }
    },
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    bundle: Path
    token: str | None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_server(
    bundle: Path,
    workdir: Path,
    *,
    token: str | None = None,
    registry: Path | None = None,
    ready_timeout: float = 90.0,
    **settings: Any,
) -> LiveServer:
    """Start ``esp serve`` on ``bundle``; ``settings`` become ``ESP_<NAME>`` variables."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESP_")}
    env.update({"ESP_BACKEND": "numpy", "ESP_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update({f"ESP_{k.upper()}": str(v) for k, v in settings.items()})
    if token is not None:
        env["ESP_ADMIN_TOKEN"] = token
    if registry is not None:
        env["ESP_REGISTRY"] = str(registry)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "subspace.cli",
        "serve",
        "--bundle",
        str(bundle),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "info",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log_path, bundle, token)
    deadline = time.monotonic() + ready_timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"server not ready after {ready_timeout}s:\n{server.log()[-3000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    started: list[LiveServer] = []

    def make(bundle: Path, **kw: Any) -> LiveServer:
        server = start_server(bundle, tmp_path_factory.mktemp("server"), **kw)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def rebundle(src: Path, out: Path, *, seed: int, corrupt: bool = False) -> Path:
    """A new valid bundle with ``src``'s layout, ids, docs, encoder and operating points but
    different (seeded) embeddings, hence a different version. ``corrupt``: then flip bytes in
    its embeddings so the checksum no longer matches."""
    b = read_bundle(src)
    rng = np.random.default_rng(seed)
    emb = normalize_blocks(rng.standard_normal(b.embeddings.shape).astype(np.float32), b.layout)
    sections = {
        k: v
        for k, v in b.manifest.items()
        if k not in {"format_version", "version", "layout", "corpus", "files"}
    }
    write_bundle(out, b.layout, emb, b.ids, docs=b.docs(), encoder_dir=b.encoder_dir, sections=sections)
    if corrupt:
        path = out / "embeddings.npy"
        data = bytearray(path.read_bytes())
        data[-8:] = bytes(255 - x for x in data[-8:])
        path.write_bytes(bytes(data))
    return out


@pytest.fixture(scope="session")
def served_bundle(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("served") / "bundle"
    shutil.copytree(tiny_bundle, dest)
    return dest


@pytest.fixture(scope="session")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "registry.json"
    path.write_text(json.dumps(REGISTRY_DOC), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def admin_token() -> str:
    return "tok-" + secrets.token_hex(16)


@pytest.fixture(scope="session")
def served(
    served_bundle: Path, registry_file: Path, admin_token: str, server_factory: Callable[..., LiveServer]
) -> LiveServer:
    """The shared server: tiny bundle, numpy backend, admin token, registry with experiment 'ent'."""
    return server_factory(
        served_bundle,
        token=admin_token,
        registry=registry_file,
        max_queries=8,
        max_k=50,
        max_body_bytes=65536,
    )


@pytest.fixture(scope="session")
def served_layout(served_bundle: Path) -> SubspaceLayout:
    return read_bundle(served_bundle).layout
