"""``POST /v1/embeddings`` on a held encoder, in-process (lifespan included): at most
``ESP_MAX_EMBEDDING_QUEUE`` requests on the encoder at once (429 with Retry-After beyond), and
every request answered by ``ESP_EMBEDDING_DEADLINE_SECONDS``: one still waiting is taken off the
queue (429), one encoding is answered 503 and stops at its next batch of texts."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from esp_retrieval.service.app import create_app
from esp_retrieval.service.config import Settings
from esp_retrieval.service.routes.embeddings import ENCODE_BATCH
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from tests.service.conftest import in_process, until


class HeldEncoder:
    """An encoder that holds every encode until its gate opens; it records the texts it encoded."""

    def __init__(self, layout: SubspaceLayout) -> None:
        self.layout = layout
        self.gate = threading.Event()
        self.started = threading.Event()
        self.encoded: list[list[str]] = []

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) + 2 for t in texts]

    def encode(self, texts: list[str]) -> np.ndarray:
        self.started.set()
        self.gate.wait(timeout=60)
        self.encoded.append(list(texts))
        rng = np.random.default_rng(len(texts))
        return normalize_blocks(rng.standard_normal((len(texts), self.layout.dim)).astype(np.float32), self.layout)


Scenario = Callable[[httpx.AsyncClient, HeldEncoder, Any], Awaitable[Any]]


def run(bundle: Path, scenario: Scenario, **settings: Any) -> Any:
    """``scenario(client, encoder, app)`` against the app serving ``bundle`` with a held encoder."""
    app = create_app(Settings(bundle=bundle, backend="numpy", threads=1, **settings))
    held: list[HeldEncoder] = []

    def hold(state: Any) -> HeldEncoder:
        held.append(HeldEncoder(state.layout))
        return held[0]

    async def go() -> Any:
        async with in_process(app, encoder=hold) as client:
            try:
                return await scenario(client, held[0], app)
            finally:
                held[0].gate.set()

    return asyncio.run(go())


def embed(client: httpx.AsyncClient, texts: list[str]) -> Awaitable[httpx.Response]:
    return client.post("/v1/embeddings", json={"input": texts})


def test_one_request_more_than_the_queue_holds_is_429_with_retry_after(small_bundle: Path) -> None:
    async def scenario(client: httpx.AsyncClient, encoder: HeldEncoder, app: Any) -> list[httpx.Response]:
        first = asyncio.create_task(embed(client, ["held on the encoder"]))
        await until(encoder.started.is_set)
        second = asyncio.create_task(embed(client, ["waits behind it"]))
        await until(lambda: app.state.embedding_queue.admitted == 2)
        refused = await embed(client, ["one too many"])
        encoder.gate.set()
        answered = [await first, await second]
        await until(lambda: app.state.embedding_queue.admitted == 0)
        return [refused, *answered, await embed(client, ["room again"])]

    refused, first, second, after = run(
        small_bundle, scenario, max_embedding_queue=2, embedding_deadline_seconds=600
    )
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]  # OpenAI's shape: its clients back off on rate_limit_error
    assert (error["type"], error["code"]) == ("rate_limit_error", "overloaded")
    assert "ESP_MAX_EMBEDDING_QUEUE" in error["message"]
    assert [first.status_code, second.status_code, after.status_code] == [200, 200, 200]
    assert len(after.json()["data"]) == 1


def test_past_the_deadline_a_waiting_request_is_429_and_an_encoding_one_503(small_bundle: Path) -> None:
    many = [f"text {i}" for i in range(ENCODE_BATCH + 1)]  # two encoder batches

    async def scenario(client: httpx.AsyncClient, encoder: HeldEncoder, app: Any) -> Any:
        first = asyncio.create_task(embed(client, many))
        await until(encoder.started.is_set)
        waiting = await embed(client, ["never reaches the encoder"])
        encoding = await first
        encoder.gate.set()  # the first job's batch returns; it stops before its second one
        await until(lambda: app.state.embedding_queue.admitted == 0)
        return waiting, encoding, await embed(client, ["served again"])

    waiting, encoding, after = run(
        small_bundle, scenario, max_embedding_queue=4, embedding_deadline_seconds=0.5
    )
    assert waiting.status_code == 429
    assert waiting.headers["retry-after"] == "1"
    assert "ESP_EMBEDDING_DEADLINE_SECONDS" in waiting.json()["error"]["message"]
    assert encoding.status_code == 503
    assert encoding.json()["error"]["param"] == "input"
    assert encoding.headers["retry-after"] == "1"  # the deadline, rounded up to whole seconds
    assert after.status_code == 200


def test_the_waiting_request_is_never_encoded_and_the_late_one_stops(small_bundle: Path) -> None:
    many = [f"text {i}" for i in range(2 * ENCODE_BATCH)]

    async def scenario(client: httpx.AsyncClient, encoder: HeldEncoder, app: Any) -> list[list[str]]:
        first = asyncio.create_task(embed(client, many))
        await until(encoder.started.is_set)
        await embed(client, ["never reaches the encoder"])
        await first
        encoder.gate.set()
        await until(lambda: app.state.embedding_queue.admitted == 0)
        return encoder.encoded

    encoded = run(small_bundle, scenario, embedding_deadline_seconds=0.5)
    assert len(encoded) == 1 and len(encoded[0]) == ENCODE_BATCH  # one batch of the first, none after


def test_batches_give_the_vectors_one_call_gives(small_bundle: Path) -> None:
    """Encoded a batch at a time, in the encoder's order, the vectors are those of one call."""

    class Echo(HeldEncoder):
        def encode(self, texts: list[str]) -> np.ndarray:
            out = np.zeros((len(texts), self.layout.dim), np.float32)
            out[:, 0] = [float(len(t)) for t in texts]
            return out

    texts = [("x" * (i % 37 + 1)) for i in range(3 * ENCODE_BATCH + 5)]

    async def scenario(client: httpx.AsyncClient, encoder: HeldEncoder, app: Any) -> httpx.Response:
        app.state.holder.current = dataclasses.replace(app.state.holder.current, encoder=Echo(encoder.layout))
        return await embed(client, texts)

    r = run(small_bundle, scenario)
    assert r.status_code == 200, r.text
    assert [row["embedding"][0] for row in r.json()["data"]] == [float(len(t)) for t in texts]


def test_a_request_whose_caller_goes_away_is_dropped_from_the_queue(small_bundle: Path) -> None:
    async def scenario(client: httpx.AsyncClient, encoder: HeldEncoder, app: Any) -> list[list[str]]:
        first = asyncio.create_task(embed(client, ["held on the encoder"]))
        await until(encoder.started.is_set)
        gone = asyncio.create_task(embed(client, ["its caller went away"]))
        await until(lambda: app.state.embedding_queue.admitted == 2)
        gone.cancel()
        await until(lambda: app.state.embedding_queue.admitted == 1)  # its place is free at once
        encoder.gate.set()
        assert (await first).status_code == 200
        await until(lambda: app.state.embedding_queue.admitted == 0)
        return encoder.encoded

    assert run(small_bundle, scenario, embedding_deadline_seconds=600) == [["held on the encoder"]]
