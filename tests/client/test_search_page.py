"""The SDK sends ``offset``, ``score_threshold`` and ``fields`` as the API names them and reads
each hit's ``fields`` back typed."""

from __future__ import annotations

from esp_retrieval.client.client import search_json
from esp_retrieval.client.models import SearchResponse


def test_the_page_and_the_fields_are_in_the_search_body_only_when_given() -> None:
    body = search_json("q", k=5, offset=10, score_threshold=0.25, fields=("year", "title"))
    assert body == {
        "queries": [{"text": "q"}], "k": 5, "offset": 10, "score_threshold": 0.25, "fields": ["year", "title"],
    }
    assert search_json("q", k=5, fields=[]) == {"queries": [{"text": "q"}], "k": 5, "fields": []}
    assert set(search_json("q")) == {"queries", "k"}


def test_a_hits_fields_are_read_back_with_their_types() -> None:
    answer = {
        "results": [{"hits": [{
            "id": "d1", "score": 0.5, "subspace_scores": {"a": 0.5},
            "fields": {"year": 2020, "rating": 2.5, "flag": True, "published": "2020-01-05T00:00:00Z", "lang": None},
        }]}],
        "weights_used": {"a": 1.0},
        "bundle_version": "v1",
        "backend": "numpy",
    }
    hit = SearchResponse.model_validate(answer).results[0].hits[0]
    assert hit.fields == {"year": 2020, "rating": 2.5, "flag": True, "published": "2020-01-05T00:00:00Z", "lang": None}
    assert isinstance(hit.fields["year"], int) and isinstance(hit.fields["flag"], bool)
    assert SearchResponse.model_validate({**answer, "results": [{"hits": [{"id": "d", "score": 0, "subspace_scores": {}}]}]}).results[0].hits[0].fields is None
