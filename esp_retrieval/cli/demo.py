"""``make demo``: serve a trained bundle and show the weights changing the ranking of one query.

Runs the server (``esp serve``) in the foreground; a background thread waits for ``/readyz``,
sends the same query twice, once with semantic-heavy and once with entity-heavy weights,
prints both top-k lists side by side, the two ``curl`` commands that reproduce them and the
URL of the playground page (``GET /ui``: a slider per subspace).

    python -m esp_retrieval.cli.demo --artifacts artifacts/demo [--query "who is robert gray"]
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esp_retrieval.client.client import ESPClient, ESPError, search_json
from esp_retrieval.client.models import LayoutResponse, SearchResponse

DEFAULT_QUERY = "who is robert gray"
HEAVY, LIGHT = 1.0, 0.1


def find_bundle(root: Path) -> Path:
    """``root`` itself when it is a bundle, else the shallowest bundle below it."""
    if (root / "manifest.json").is_file():
        return root
    found = sorted(root.rglob("manifest.json"), key=lambda p: len(p.parts))
    if not found:
        raise FileNotFoundError(f"no bundle (manifest.json) under {root}")
    return found[0].parent


def weight_vectors(layout: LayoutResponse) -> dict[str, dict[str, float]]:
    """A semantic-heavy and an entity-heavy weight vector for this layout's subspace names (a
    sparse block, e.g. bm25, light in both)."""
    names = [s.name for s in layout.subspaces]
    semantic = "semantic" if "semantic" in names else names[0]
    entity = "entity" if "entity" in names else names[min(1, len(names) - 1)]
    every = [*names, *(s.name for s in layout.sparse)]
    return {
        f"{semantic}-heavy": {n: HEAVY if n == semantic else LIGHT for n in every},
        f"{entity}-heavy": {n: HEAVY if n == entity else LIGHT for n in every},
    }


def curl(url: str, body: dict[str, Any]) -> str:
    return (
        f"curl -s -X POST {url}/v1/search -H 'content-type: application/json' "
        f"-d {shlex.quote(json.dumps(body))}"
    )


def page_url(url: str) -> str:
    """The playground page of the server at ``url``."""
    return f"{url}/ui"


def _cell(hit: Any, width: int) -> str:
    label = (hit.title or hit.text or "").replace("\n", " ")
    return textwrap.shorten(f"{hit.score:6.3f} {hit.id:>8} {label}", width=width, placeholder="...")


def side_by_side(titles: Sequence[str], results: Sequence[SearchResponse], width: int = 58) -> str:
    cols = [[_cell(h, width) for h in r.results[0].hits] for r in results]
    lines = ["  ".join(f"{t:<{width}}" for t in titles), "  ".join("-" * width for _ in titles)]
    for row in range(max(len(c) for c in cols)):
        lines.append("  ".join(f"{(c[row] if row < len(c) else ''):<{width}}" for c in cols))
    return "\n".join(lines)


def show(url: str, query: str, k: int = 5, out: Any = sys.stdout) -> list[SearchResponse]:
    """Wait for the server, run both requests, print the lists and the curl commands."""
    with ESPClient(url, timeout=60) as client:
        client.wait_ready(timeout=900)
        vectors = weight_vectors(client.layout())
        bodies = {name: search_json([query], k=k, weights=w) for name, w in vectors.items()}
        results = [client.search([query], k=k, weights=w) for w in vectors.values()]
    print(f"\nESP demo: the same query, two weight vectors ({url})\nquery: {query!r}\n", file=out)
    print(side_by_side(list(vectors), results), file=out)
    ids = [[h.id for h in r.results[0].hits] for r in results]
    moved = "the ranking changes" if ids[0] != ids[1] else "same ranking for this query"
    print(f"\n{moved}; try it yourself:\n", file=out)
    for name, body in bodies.items():
        print(f"# {name}\n{curl(url, body)}\n", file=out)
    print(f"# or move the weights yourself, one slider per subspace:\n{page_url(url)}\n", file=out)
    out.flush()
    return results


def _show_in_background(url: str, query: str) -> None:
    try:
        show(url, query)
    except (ESPError, OSError) as exc:
        print(f"demo requests failed: {exc}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifacts", default="artifacts/demo", help="bundle dir, or a dir holding one")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--query", default=DEFAULT_QUERY)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args(argv)
    try:
        bundle = find_bundle(Path(args.artifacts))
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    url = f"http://{args.host}:{args.port}"
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness polls would flood the terminal
    threading.Thread(target=_show_in_background, args=(url, args.query), daemon=True).start()
    from esp_retrieval.cli.main import main as esp

    serve = [
        "serve",
        "--bundle",
        str(bundle),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--no-access-log",
    ]
    if args.backend:
        serve += ["--backend", args.backend]
    return esp(serve)


if __name__ == "__main__":
    raise SystemExit(main())
