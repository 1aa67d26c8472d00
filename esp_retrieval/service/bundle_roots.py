"""Where a bundle may be loaded from: ``ESP_BUNDLE_ROOTS``, checked by every path that loads one.

``ESP_BUNDLE_ROOTS`` is a comma-separated list of local folders (absolute) and URI prefixes
(``s3://models/esp/``, ``https://models.example/bundles/``). Unset (the default), any bundle may
be loaded, as before the setting existed. Set, :func:`check_bundle_source` refuses a bundle
outside every root: the start-up bundle (the settings do not validate, so the server does not
start), ``POST /v1/admin/reload`` and the registry file's ``bundle`` (the rollout) alike.

A local path is resolved first (``Path.resolve``: symlinks and ``..`` followed) and must then be
inside a resolved root, so a symlink or ``..`` out of a root is refused; the caller loads the
resolved folder, so a symlink swapped after the check is not followed. A URI must start with a
prefix (at a ``/`` boundary: ``s3://models/esp`` does not admit ``s3://models/esp-other``) and
may hold no ``.`` or ``..`` segment, which the storage would resolve and this check cannot.
The check runs before anything is read or fetched.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from esp_retrieval.service.remote_bundle import is_uri
from esp_retrieval.subspace.bundle import BundleError

__all__ = ["SETTING", "BundleRootError", "check_bundle_source", "parse_roots"]

SETTING = "ESP_BUNDLE_ROOTS"


class BundleRootError(BundleError):
    """A bundle named outside the allowed bundle roots (``field``: where it was named)."""


def parse_roots(value: str) -> tuple[str, ...]:
    """The roots of a ``ESP_BUNDLE_ROOTS`` value (empty: no restriction); a relative folder is
    a ``ValueError`` (relative to what?)."""
    roots = tuple(part.strip() for part in value.split(",") if part.strip())
    for root in roots:
        if not is_uri(root) and not Path(root).is_absolute():
            raise ValueError(f"{SETTING}: {root!r} is neither an absolute folder nor a URI prefix (scheme://...)")
    return roots


def _uri_inside(uri: str, prefix: str) -> bool:
    segments = unquote(uri.partition("://")[2]).split("/")
    if "." in segments or ".." in segments:
        return False
    base = prefix if prefix.endswith("/") else prefix + "/"
    return (uri.rstrip("/") + "/").startswith(base)


def check_bundle_source(source: Path | str, roots: tuple[str, ...], field: str) -> Path | str:
    """``source`` as it is to be loaded: a URI unchanged, a local path resolved; raises
    :class:`BundleRootError` (naming ``field`` and the roots) when ``roots`` are set and it is
    inside none of them. No roots: ``source`` unchanged, nothing checked."""
    if not roots:
        return source
    if is_uri(source):
        if any(is_uri(root) and _uri_inside(source, root) for root in roots):
            return source
        where = repr(source)
    else:
        resolved = Path(source).resolve()
        if any(not is_uri(root) and resolved.is_relative_to(Path(root).resolve()) for root in roots):
            return resolved
        shown = f" (resolved: {str(resolved)!r})" if str(resolved) != str(source) else ""
        where = repr(str(source)) + shown
    raise BundleRootError(
        f"{field}: the bundle at {where} is outside the allowed bundle roots ({SETTING}: {', '.join(roots)})",
        field,
    )
