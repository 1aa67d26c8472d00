"""The SDK sends a metadata filter as the body's ``filter`` (and nothing when there is none)."""

from __future__ import annotations

from esp_retrieval.client.client import search_json


def test_the_filter_goes_into_the_body() -> None:
    flt = {"and": [{"field": "lang", "eq": "en"}, {"not": {"field": "year", "lt": 2015}}]}
    body = search_json("who is robert gray", k=3, filter=flt)
    assert body["filter"] == flt and body["k"] == 3
    assert "filter" not in search_json("x")
