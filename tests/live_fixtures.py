"""Live-server fixtures (a plugin of ``tests/conftest.py``): bundles built in the test, and the real server (uvicorn via ``esp serve``).

``server_factory(bundle, **settings)`` launches ``python -m esp_retrieval.cli serve`` on a free
loopback port in a subprocess (:func:`bench.live_server.start_server`), waits for ``/readyz``
and returns a :class:`LiveServer` (``url``, ``log()``, ``stop()``); the servers it started stop
when the test ends. ``module_server_factory`` is the same for module-scoped fixtures (stopped
after the module). ``served`` is one shared server on a copy of the tiny bundle (encoder + docs)
with an admin token and a registry file holding an experiment, ``vectors_served`` the same on its
vectors alone; each stops once the last test that uses it has run (see
:func:`pytest_runtest_teardown`), so no idle server keeps a core busy for the rest of the suite.
Tests that change what is served start their own.

A test that uses any of these fixtures gets the ``live`` marker (``tests/conftest.py``); one that
starts a server another way must carry it itself, or :func:`bench.live_server.spawn` refuses.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.live_server import LiveServer, start_server
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

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


#: What every test server runs with unless a test says otherwise (exact and one thread: stable;
#: a latency budget no test machine misses, so a busy one does not shed a search with a 429).
SERVER_DEFAULTS: dict[str, Any] = {"backend": "numpy", "threads": 1, "latency_budget_ms": 600_000}


def _factory(tmp_path_factory: pytest.TempPathFactory, started: list[LiveServer]) -> Callable[..., LiveServer]:
    def make(
        bundle: Path, *, token: str | None = None, registry: Path | None = None, **settings: Any
    ) -> LiveServer:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = start_server(  # generous readiness: a busy 2-core machine loads an encoder slowly
            bundle, log_path, settings={**SERVER_DEFAULTS, **settings}, token=token, registry=registry,
            ready_timeout=300,
        )
        started.append(server)
        return server

    return make


def _stop_all(started: list[LiveServer]) -> None:
    for server in started:
        server.stop()


@pytest.fixture
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """``make(bundle, token=..., registry=..., **settings)``: a started server, stopped when the test ends."""
    started: list[LiveServer] = []
    yield _factory(tmp_path_factory, started)
    _stop_all(started)


@pytest.fixture(scope="module")
def module_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """``server_factory`` for module-scoped fixtures: its servers stop after the module's last test."""
    started: list[LiveServer] = []
    yield _factory(tmp_path_factory, started)
    _stop_all(started)


@pytest.fixture(scope="session")
def _shared_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """The shared servers' factory (``served``, ``vectors_served``): whatever is still running at the end stops."""
    started: list[LiveServer] = []
    yield _factory(tmp_path_factory, started)
    _stop_all(started)


#: The session-wide servers: each is stopped after the last collected test that uses it.
SHARED_SERVERS = ("served", "vectors_served")
_LAST_USERS = pytest.StashKey[dict[str, list[str]]]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller tells each worker how it hands out tests (a worker's own
    ``--dist`` reads ``no``)."""
    node.workerinput["dist"] = node.config.getoption("dist")


def _runs_in_collection_order(config: pytest.Config) -> bool:
    """Whether this process runs its tests in collection order: without pytest-xdist, or under
    ``--dist load`` or ``loadscope``/``loadfile`` without reordering (``make test``): its
    workers get their tests in that order. Other modes keep the shared servers to the end."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return True
    dist = workerinput.get("dist")
    return dist == "load" or (dist in ("loadscope", "loadfile") and not config.getoption("loadscopereorder", True))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Note, per test, the shared servers it is the last user of (in the order the tests run)."""
    if not _runs_in_collection_order(config):
        return
    last: dict[str, str] = {}
    for item in items:
        for name in SHARED_SERVERS:
            if name in getattr(item, "fixturenames", ()):
                last[name] = item.nodeid
    by_item: dict[str, list[str]] = {}
    for name, nodeid in last.items():
        by_item.setdefault(nodeid, []).append(name)
    config.stash[_LAST_USERS] = by_item


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last user of a shared server, stop it (its fixture value stays, a stopped server).
    A fixture must name a shared server among its arguments, not ask for it with
    ``request.getfixturevalue``: this hook sees only what the signatures say.

    Under pytest-xdist every worker sees the whole collection in the same order and (see
    :func:`_runs_in_collection_order`) runs its share in that order, so no later test of any
    worker uses a server stopped here; a worker that does not run the last user stops its copy
    at the end of the session."""
    try:
        yield
    finally:
        for name in item.config.stash.get(_LAST_USERS, {}).get(item.nodeid, ()):
            server = getattr(item, "funcargs", {}).get(name)
            if isinstance(server, LiveServer):
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


def with_bm25(src: Path, out: Path, *, weight: float = 0.3) -> Path:
    """``src`` (layout, ids, docs, encoder, operating points, embeddings) plus a sparse BM25 block
    ``bm25`` over its passages (``esp_retrieval.training.sparse_lexical``), default weight ``weight``."""
    from esp_retrieval.training.sparse_lexical import build_bm25

    b = read_bundle(src)
    docs = b.docs()
    assert docs is not None, f"{src} has no docs.jsonl to build the BM25 block from"
    sections = {
        k: v
        for k, v in b.manifest.items()
        if k not in {"format_version", "version", "layout", "corpus", "files", "sparse"}
    }
    return write_bundle(out, b.layout, np.asarray(b.embeddings), b.ids, docs=docs, encoder_dir=b.encoder_dir,
                        sections=sections, sparse={"bm25": build_bm25([d["text"] for d in docs])},
                        sparse_weights={"bm25": weight})


def vectors_only(src: Path, out: Path, *, seed: int | None = None, corrupt: bool = False) -> Path:
    """``src``'s layout and ids without the encoder (a server on it is ready in seconds): its
    embeddings, or seeded ones (a different version) with ``seed``. ``corrupt``: flip bytes in
    the embeddings after writing, so the checksum in the (unchanged) manifest no longer matches."""
    b = read_bundle(src)
    emb = np.asarray(b.embeddings)
    if seed is not None:
        emb = normalize_blocks(np.random.default_rng(seed).standard_normal(emb.shape).astype(np.float32), b.layout)
    write_bundle(out, b.layout, emb, b.ids)
    if corrupt:
        path = out / "embeddings.npy"
        data = bytearray(path.read_bytes())
        data[-8:] = bytes(255 - x for x in data[-8:])
        path.write_bytes(bytes(data))
    return out


@pytest.fixture(scope="session")
def vectors_served(served_bundle: Path, registry_file: Path, admin_token: str,
                   _shared_server_factory: Callable[..., LiveServer], tmp_path_factory: pytest.TempPathFactory
                   ) -> LiveServer:
    """Like ``served`` (registry, token, limits) on the tiny bundle's vectors without its encoder:
    for tests that need a live server but no text queries (ready in seconds, not a model load)."""
    bundle = vectors_only(served_bundle, tmp_path_factory.mktemp("vectors-served") / "bundle")
    return _shared_server_factory(bundle, token=admin_token, registry=registry_file, max_queries=8, max_k=50,
                          max_body_bytes=65536)


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
    served_bundle: Path, registry_file: Path, admin_token: str,
    _shared_server_factory: Callable[..., LiveServer],
) -> LiveServer:
    """The shared server: tiny bundle, numpy backend, admin token, registry with experiment 'ent'."""
    return _shared_server_factory(
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
