"""Serve a bundle over HTTP: the search API with per-request weights (uvicorn + FastAPI).

Options become ``ESP_*`` settings (esp_retrieval/service/config.py); anything not given here comes from the
environment. The admin token is read from ``ESP_ADMIN_TOKEN`` only, never from the command
line (where ``ps`` would show it). The bundle's manifest is checked before the server starts,
so a wrong path fails at once; the full validation (checksums, engine, encoder, warm-up) runs
in the server, and ``/readyz`` turns 200 when it is done. A bundle URI (``s3://``, ``https://``,
...) with ``--bundle-sha256`` is fetched by the server into ``ESP_BUNDLE_CACHE``, checked
against that digest, then loaded the same way (service/remote_bundle.py). HTTP limits (header size and count,
header and body read timeouts, keep-alive, connections, lingering close) come from the
``ESP_*`` settings too (:func:`http_options`).

Example: esp serve --bundle artifacts/demo/bundle --port 8000 --backend numpy
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from esp_retrieval.service.engine import BACKENDS, PRECISIONS
from esp_retrieval.subspace.bundle import BundleError, read_manifest

if TYPE_CHECKING:
    from esp_retrieval.service.config import Settings

#: option dest -> settings environment variable
_ENV = {
    "bundle": "ESP_BUNDLE",
    "bundle_sha256": "ESP_BUNDLE_SHA256",
    "registry": "ESP_REGISTRY",
    "backend": "ESP_BACKEND",
    "precision": "ESP_PRECISION",
    "threads": "ESP_THREADS",
    "max_batch": "ESP_MAX_BATCH",
    "max_wait_ms": "ESP_MAX_WAIT_MS",
    "queue_size": "ESP_QUEUE_SIZE",
    "max_queries": "ESP_MAX_QUERIES",
    "max_k": "ESP_MAX_K",
    "log_format": "ESP_LOG_FORMAT",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bundle",
        help="bundle directory to serve, or the URI of one in object storage (s3://, gs://, https://, "
        "file://; fetched into ESP_BUNDLE_CACHE first) (else ESP_BUNDLE)",
    )
    parser.add_argument(
        "--bundle-sha256", help="sha256 of a remote bundle's manifest.json (else ESP_BUNDLE_SHA256)"
    )
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1, or ESP_HOST)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8000, or ESP_PORT)")
    parser.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes (each loads the bundle)"
    )
    parser.add_argument("--backend", help=f"engine backend: {', '.join(['auto', *BACKENDS])} (default auto)")
    parser.add_argument("--precision", help=f"index precision: {', '.join(PRECISIONS)} (default float32)")
    parser.add_argument("--threads", type=int, help="engine threads")
    parser.add_argument("--registry", help="operating points / experiments file (YAML or JSON)")
    parser.add_argument("--max-batch", type=int, help="queries per micro-batch")
    parser.add_argument("--max-wait-ms", type=float, help="how long the micro-batcher gathers")
    parser.add_argument("--queue-size", type=int, help="queued queries before 429")
    parser.add_argument("--max-queries", type=int, help="queries per request")
    parser.add_argument("--max-k", type=int, help="largest k")
    parser.add_argument("--no-batching", action="store_true", help="one engine call per request")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-access-log", action="store_true", help="do not log every request")
    parser.add_argument(
        "--log-format", choices=["json", "text"],
        help="json lines (default) or text for a terminal (ESP_LOG_FORMAT)",
    )


def run(args: argparse.Namespace) -> int:
    for dest, env in _ENV.items():
        value = getattr(args, dest)
        if value is not None:
            os.environ[env] = str(value)
    if args.no_batching:
        os.environ["ESP_BATCHING"] = "false"

    from pydantic import ValidationError

    from esp_retrieval.service.config import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    if settings.bundle_source is None:
        print("no bundle: pass --bundle DIR or set ESP_BUNDLE", file=sys.stderr)
        return 2
    if settings.bundle_uri is not None and settings.bundle_sha256 is None:
        print(f"{settings.bundle_uri}: a bundle from object storage needs --bundle-sha256 (or "
              "ESP_BUNDLE_SHA256), the sha256 of its manifest.json (esp bundle-info prints it)",
              file=sys.stderr)
        return 2
    try:
        if settings.bundle is not None:
            read_manifest(settings.bundle)
    except BundleError as exc:
        print(f"invalid bundle: {exc}", file=sys.stderr)
        return 1

    import uvicorn

    from esp_retrieval.service.logs import log_config

    if settings.log_format == "json":
        os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars (model loading) are not log lines
    uvicorn.run(
        "esp_retrieval.service.app:create_app",
        factory=True,
        host=args.host or settings.host,
        port=args.port or settings.port,
        workers=args.workers,
        log_level=args.log_level,
        log_config=log_config(settings.log_format, args.log_level),
        access_log=not args.no_access_log,
        timeout_graceful_shutdown=15,
        **http_options(settings),
    )
    return 0


def http_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the HTTP limits of ``settings`` (README "HTTP limits").

    The protocol is :class:`esp_retrieval.service.http_limits.LimitedHttpToolsProtocol` (header size, count
    and read timeouts, body read timeout, lingering close), named by import string so worker
    processes import it and read the same ``ESP_*`` settings; without httptools, uvicorn's h11
    protocol with its header size limit. Keep-alive and concurrency are uvicorn's own options.
    """
    try:
        import httptools  # noqa: F401
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        http = "h11"
    else:
        http = "esp_retrieval.service.http_limits:LimitedHttpToolsProtocol"
    return {
        "http": http,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_keep_alive": settings.keep_alive_seconds,
        "limit_concurrency": settings.max_connections,
    }
