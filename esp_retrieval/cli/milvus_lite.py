"""Serve one Milvus Lite file over TCP, so that several processes share it (replicas, a load).

A Milvus Lite file (``*.db``) opened through pymilvus by path is locked by the one process that
opened it: a second ``esp serve`` on the same file cannot start. This runs the Milvus Lite
server of ``milvus-lite`` (the package pymilvus opens files with) on ``HOST:PORT`` instead;
every client then uses ``--uri http://HOST:PORT`` (``ESP_MILVUS_URI``): ``esp milvus-load``,
any number of ``esp serve`` replicas, ``bench/milvus.py``. Once the server answers, one JSON
line says where (``uri``); it serves until SIGTERM or Ctrl+C (exit status 0), and exits with 1
when the server stops on its own. Milvus Lite is a single-process server for development and
tests; a production deployment runs Milvus standalone or a cluster.

Example:  esp milvus-lite artifacts/esp.db --port 19530
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", help="the Milvus Lite file (created when missing; letters, digits, . - _)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=19530, help="TCP port (default 19530)")
    parser.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds to wait for the server to answer"
    )


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _ready(host: str, port: int, deadline: float) -> bool:
    """The port accepts connections and the server answers a gRPC call."""
    from pymilvus import MilvusClient

    while time.monotonic() < deadline:
        if _answers(host, port):
            try:
                client = MilvusClient(uri=f"http://{host}:{port}", timeout=5.0, alias=f"esp-ready-{port}")
            except Exception:  # not answering yet
                time.sleep(0.2)
                continue
            try:
                client.list_collections()
                return True
            finally:
                client.close()
        time.sleep(0.2)
    return False


def run(args: argparse.Namespace) -> int:
    from milvus_lite.server import Server

    db = Path(args.db).resolve()
    if not db.parent.is_dir():
        print(f"esp milvus-lite: {db.parent} is not a folder", file=sys.stderr)
        return 2
    if _answers(args.host, args.port):
        print(f"esp milvus-lite: {args.host}:{args.port} is taken", file=sys.stderr)
        return 1
    try:
        server = Server(str(db), address=f"{args.host}:{args.port}")
    except RuntimeError as exc:  # a file name Milvus Lite refuses
        print(f"esp milvus-lite: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _serve(server, db, args, stop)
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve(server: Any, db: Path, args: argparse.Namespace, stop: threading.Event) -> int:
    """Start ``server``, say where once it answers, serve until ``stop``; the exit status."""
    host, port = args.host, args.port
    if not server.init() or not server.start():
        print(f"esp milvus-lite: the server did not start on {db} (is the file in use?)", file=sys.stderr)
        return 1
    if not _ready(host, port, time.monotonic() + args.ready_timeout):
        print(f"esp milvus-lite: no answer on {host}:{port}", file=sys.stderr)
        return 1
    print(json.dumps({"uri": f"http://{host}:{port}", "db": str(db)}), flush=True)
    while not stop.wait(1.0):
        if not _answers(host, port):
            print("esp milvus-lite: the server stopped", file=sys.stderr)
            return 1
    return 0
