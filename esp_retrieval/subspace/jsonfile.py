"""Read a JSON object from a file of a bundle or an encoder folder, every problem one error.

The bundle's ``manifest.json`` and the encoder's ``esp_encoder.json`` are read the same way:
missing, not JSON, not an object, or without a required field is one ``error`` naming the file.
:func:`parse_json_object` does the same for bytes already read (and hashed) by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from esp_retrieval.subspace.errors import FieldError


def read_json_object(
    path: Path, error: type[FieldError], *, required: Iterable[str] = (), folder: str = "directory"
) -> dict[str, Any]:
    """The JSON object in ``path``; raises ``error`` (message names the file, ``folder`` what
    ``path.parent`` should be) when it is missing, invalid, not an object or lacks a key."""
    if not path.is_file():
        raise error(f"{path}: missing (is {path.parent} a {folder}?)")
    return parse_json_object(path.read_bytes(), path.name, error, required=required)


def parse_json_object(
    data: bytes, name: str, error: type[FieldError], *, required: Iterable[str] = ()
) -> dict[str, Any]:
    """The JSON object in ``data`` (the file ``name``'s bytes); raises ``error`` naming ``name``
    when it is not UTF-8 JSON, not an object or lacks a key."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{name}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise error(f"{name}: must be a JSON object")
    for key in required:
        if key not in obj:
            raise error(f"{name}: missing field {key!r}")
    return obj
