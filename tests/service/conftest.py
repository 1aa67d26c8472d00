"""Fixtures and helpers of the service's tests that run the app in-process (lifespan included):
a small bundle without an encoder, :func:`until`, and :func:`in_process`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from esp_retrieval.subspace.bundle import write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks


@pytest.fixture
def small_bundle(tmp_path: Path) -> Path:
    """40 random documents in blocks ``semantic`` (8) and ``entity`` (4); no encoder, no docs."""
    layout = SubspaceLayout.from_dims({"semantic": 8, "entity": 4})
    rng = np.random.default_rng(0)
    emb = normalize_blocks(rng.standard_normal((40, layout.dim)).astype(np.float32), layout)
    return write_bundle(tmp_path / "b", layout, emb, [f"d{i}" for i in range(40)])


async def until(predicate: Callable[[], bool], seconds: float = 60.0) -> None:
    """Wait for ``predicate()``; fail after ``seconds`` (a hang, not a timing threshold)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def in_process(app: FastAPI, **swap: Callable[[Any], Any]) -> AsyncIterator[httpx.AsyncClient]:
    """The app started (its lifespan) and its first bundle served, each field of the served state
    named in ``swap`` replaced by what its function makes of the state (a test's engine or
    encoder); an httpx client on it."""
    async with app.router.lifespan_context(app):
        await until(lambda: app.state.holder.current is not None)
        state = app.state.holder.current
        app.state.holder.current = dataclasses.replace(state, **{k: f(state) for k, f in swap.items()})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            yield client
