"""``GET /ui``: the playground page, served from files inside the package (``esp_retrieval/service/ui/``).

One HTML page, one script and one style sheet, shipped as package data: no CDN, no build step,
so the page works in an air-gapped cluster. It calls only the service's own API (``/v1/layout``,
``/v1/operating-points``, ``/v1/experiments``, ``/v1/search``, ``/v1/cluster``, ``/readyz``) by
URLs relative to its own, so it also works behind a path prefix. Not part of the OpenAPI
document: it is a page, not an API.

:data:`ASSETS` is the only list of files served (name -> media type); any other name is 404,
so no path from a request ever reaches the file system. Every response carries
:data:`CONTENT_SECURITY_POLICY` (the page's own script, style sheet and API only; no framing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

from esp_retrieval.service.errors import NotFoundError

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
INDEX = "index.html"

#: Every file the page is made of, with its media type; the package data must ship them all.
ASSETS: dict[str, str] = {
    INDEX: "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

#: The page runs its own script and style sheet and calls its own origin, nothing else: no inline
#: script or style, no other origin, and no page of another origin may frame it (clickjacking).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

#: The page is small and changes with the package: revalidate instead of caching stale copies.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError(f"no such file in the playground: {name!r}; files: {sorted(ASSETS)}", "name")
    return FileResponse(UI_DIR / name, media_type=media_type, headers=_HEADERS)


@router.get("/ui")
async def page() -> FileResponse:
    return _file(INDEX)


@router.get("/ui/{name}")
async def asset(name: Annotated[str, PathParam(max_length=64)]) -> FileResponse:
    return _file(name)
