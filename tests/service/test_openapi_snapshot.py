"""The HTTP API does not drift by accident: the OpenAPI document equals the committed copy.

A deliberate change regenerates ``openapi.json`` (see ``regenerate`` below) and lists the
change in the commit that makes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings

SNAPSHOT = Path(__file__).with_name("openapi.json")


def current_openapi() -> dict:
    return create_app(Settings()).openapi()


def test_openapi_equals_the_committed_copy() -> None:
    committed = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert current_openapi() == committed


def regenerate() -> None:  # python -c "from tests.service.test_openapi_snapshot import regenerate; regenerate()"
    SNAPSHOT.write_text(json.dumps(current_openapi(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
