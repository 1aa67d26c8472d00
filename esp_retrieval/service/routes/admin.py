"""Operator endpoints behind a bearer token: ``POST /v1/admin/reload`` (bundle hot reload).

The bundle is a local directory, or a URI of one in object storage with the sha256 of its
``manifest.json`` (:mod:`esp_retrieval.service.remote_bundle`).

Auth: ``Authorization: Bearer <ESP_ADMIN_TOKEN>``, compared in constant time
(``hmac.compare_digest``). Missing or malformed header -> 401, wrong token -> 403. Without a
configured token the admin routes answer 404 (disabled: nothing to guess). The token is never
logged nor echoed in an error body. The token is checked from the headers *before* the body is
read or parsed (:class:`AdminRoute`), so an unauthenticated caller learns nothing from how its
body is judged (malformed JSON without a token is 401, not 422).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from esp_retrieval.service.config import Settings
from esp_retrieval.service.errors import ForbiddenError, NotFoundError, UnauthorizedError
from esp_retrieval.service.lifecycle import load_and_activate
from esp_retrieval.service.remote_bundle import is_uri
from esp_retrieval.service.routes.deps import HolderDep, SettingsDep
from esp_retrieval.service.schemas import ReloadRequest, ReloadResponse, error_responses
from esp_retrieval.subspace.errors import FieldError

_bearer = HTTPBearer(auto_error=False, description="ESP_ADMIN_TOKEN")


def check_admin(settings: Settings, sent: str | None) -> None:
    """404 without a configured token, 401 without credentials, 403 for a wrong token."""
    token = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    if not token:
        raise NotFoundError("admin routes are disabled: the service has no admin token configured")
    if not sent:
        raise UnauthorizedError("missing admin token: send the header 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(sent.encode(), token.encode()):
        raise ForbiddenError("the admin token is not valid")


def bearer_token(authorization: str | None) -> str | None:
    """The credentials of an ``Authorization: Bearer <token>`` header (``None`` otherwise)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    return credentials.strip() or None if scheme.lower() == "bearer" else None


async def require_admin(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    check_admin(settings, credentials.credentials if credentials is not None else None)


class AdminRoute(APIRoute):
    """An :class:`APIRoute` that checks the admin token before FastAPI reads the body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            check_admin(request.app.state.settings, bearer_token(request.headers.get("authorization")))
            return await handler(request)

        return checked


router = APIRouter(tags=["admin"], dependencies=[Depends(require_admin)], route_class=AdminRoute)


@router.post(
    "/v1/admin/reload",
    response_model=ReloadResponse,
    responses=error_responses(401, 403, 404, 409, 413, 422),
    summary="Load, validate and warm a bundle beside the served one, then swap it in atomically",
)
async def reload_bundle(
    request: Request,
    settings: SettingsDep,
    holder: HolderDep,
    body: Annotated[ReloadRequest | None, Body()] = None,
) -> ReloadResponse:
    served = holder.current
    sha256 = body.sha256 if body is not None else None
    path: Path | str
    if body is not None and body.path is not None:
        path = body.path if is_uri(body.path) else Path(body.path)
    elif served is not None:
        path = served.bundle.path
    elif settings.bundle_source is not None:
        path, sha256 = settings.bundle_source, sha256 or settings.bundle_sha256
    else:
        raise FieldError("no bundle is configured: give the bundle 'path'", "path")
    t0 = time.perf_counter()
    old, new = await load_and_activate(request.app.state, path, settings, sha256=sha256)
    return ReloadResponse(
        bundle_version=new.version,
        previous_version=old.version if old is not None else None,
        path=str(new.bundle.path),
        num_docs=new.num_docs,
        backend=new.engine.name,
        seconds=round(time.perf_counter() - t0, 4),
    )
