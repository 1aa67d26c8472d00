"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with their assets served by the service itself.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and ReDoc its fonts from Google), so
they render blank in an air-gapped cluster. These pages load the same tools from files shipped
in a pinned package (``fastapi-offline``: ``swagger-ui-bundle.js``, ``swagger-ui.css``,
``redoc.standalone.js``, ``favicon.png``), served under ``/docs/assets/``, and the OpenAPI
document from the app; nothing else. :data:`ASSETS` is the only list of files served
(name -> media type); any other name is 404. One byte string is changed on the way: ReDoc's
sidebar shows a logo from its CDN (the img hides itself when that fails), so the service
points it at the favicon it serves (:data:`REWRITES`) and the page asks nothing of the outside.
URLs honour the ASGI ``root_path`` (a proxy's path prefix), as FastAPI's pages do. Not part of
the OpenAPI document. Each page carries a Content-Security-Policy (:func:`content_security_policy`):
scripts from the service and the page's own inline script by its hash only, requests to the
service only, and no framing by another page.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Annotated, NamedTuple

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from esp_retrieval.service.errors import NotFoundError

#: The package folder holding the assets (a pinned dependency, see requirements.txt).
ASSET_DIR = Path(str(files("fastapi_offline") / "static"))
ASSET_PREFIX = "/docs/assets"

ASSETS: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

#: name -> (bytes, replacement): CDN references inside an asset, pointed at served files
#: (relative to the page, so a proxy's path prefix keeps working).
REWRITES: dict[str, tuple[bytes, bytes]] = {
    "redoc.standalone.js": (
        b'src:"https://cdn.redoc.ly/redoc/logo-mini.svg"', b'src:"docs/assets/favicon.png"'
    ),
}

#: The assets change only with the pinned package: cache them for a day.
_HEADERS = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}

router = APIRouter(include_in_schema=False)

_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def content_security_policy(page: bytes) -> str:
    """The policy of a docs page: its inline scripts allowed by their sha256 and nothing else
    inline; styles may be inline (Swagger UI and ReDoc inject them); ReDoc's search runs in a
    ``blob:`` worker (``child-src`` for browsers without ``worker-src``); images and fonts from
    the service or ``data:`` (Swagger UI's icons)."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(page)
    )
    return (
        f"default-src 'none'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
        "child-src 'self' blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )


def _protected(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = content_security_policy(bytes(page.body))
    page.headers["X-Frame-Options"] = "DENY"  # frame-ancestors for browsers that predate it
    return page


class _Page(NamedTuple):
    root: str  # the proxy's path prefix (ASGI root_path), "" without one
    openapi_url: str
    title: str

    def asset(self, name: str) -> str:
        return f"{self.root}{ASSET_PREFIX}/{name}"


def _page(request: Request, tool: str) -> _Page:
    root = str(request.scope.get("root_path", "")).rstrip("/")
    app = request.app
    return _Page(root, f"{root}{app.openapi_url}", f"{app.title} - {tool}")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    page = _page(request, "Swagger UI")
    return _protected(get_swagger_ui_html(
        openapi_url=page.openapi_url,
        title=page.title,
        oauth2_redirect_url=f"{page.root}/docs/oauth2-redirect",
        swagger_js_url=page.asset("swagger-ui-bundle.js"),
        swagger_css_url=page.asset("swagger-ui.css"),
        swagger_favicon_url=page.asset("favicon.png"),
    ))


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return _protected(get_swagger_ui_oauth2_redirect_html())


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    page = _page(request, "ReDoc")
    return _protected(get_redoc_html(
        openapi_url=page.openapi_url,
        title=page.title,
        redoc_js_url=page.asset("redoc.standalone.js"),
        redoc_favicon_url=page.asset("favicon.png"),
        with_google_fonts=False,
    ))


@lru_cache(maxsize=len(REWRITES))
def _rewritten(name: str) -> bytes:
    old, new = REWRITES[name]
    return (ASSET_DIR / name).read_bytes().replace(old, new)


@router.get(f"{ASSET_PREFIX}/{{name}}")
async def asset(name: Annotated[str, PathParam(max_length=64)]) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError(f"no such docs asset: {name!r}; files: {sorted(ASSETS)}", "name")
    if name in REWRITES:
        return Response(_rewritten(name), media_type=media_type, headers=_HEADERS)
    return FileResponse(ASSET_DIR / name, media_type=media_type, headers=_HEADERS)
