"""esp_retrieval/client/client.py: request bodies encoded by pydantic-core say what json.dumps says."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.client.client import ESPClient, ESPError, _Call, _request_args, search_json
from esp_retrieval.subspace.layout import SubspaceLayout


def _call(body: Any) -> _Call[Any]:
    return _Call("POST", "/v1/search", lambda r: r.json(), json=body)


def test_json_bodies_are_the_stdlib_json() -> None:
    queries: list[Any] = [np.linspace(-1, 1, 6), "é text", {"entity": [1.0, 2.0]}]
    body = search_json(queries, k=3, weights={"a": np.float64(0.5)})
    args = _request_args(_call(body))
    assert json.loads(args["content"]) == json.loads(json.dumps(body))
    assert args["headers"]["content-type"] == "application/json"


def test_non_finite_weights_are_sent_as_the_stdlib_writes_them() -> None:
    args = _request_args(_call({"weights": [math.nan, math.inf]}))
    assert args["content"] == b'{"weights":[NaN,Infinity]}'


def test_what_pydantic_core_cannot_encode_goes_to_httpx_and_fails_as_before() -> None:
    args = _request_args(_call({"weights": [np.float32(1.0)]}))
    assert "content" not in args
    assert args["json"] == {"weights": [np.float32(1.0)]}


def test_nan_weight_through_the_client_is_refused_by_the_server(
    served: LiveServer, served_layout: SubspaceLayout
) -> None:
    with ESPClient(served.url) as c:
        with pytest.raises(ESPError) as err:
            c.search([[1.0] * served_layout.dim], weights=[math.nan] * len(served_layout))
        assert err.value.status == 422
        assert err.value.field is not None
        assert err.value.field.startswith("weights")
        ok = c.search([[1.0] * served_layout.dim], k=2)
        assert len(ok.results[0].hits) == 2
