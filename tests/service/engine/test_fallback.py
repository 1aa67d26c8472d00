"""Backend selection: registry, ``auto``, and a fallback chain that logs why it skipped."""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np
import pytest

from esp_retrieval.service.engine import (
    AUTO_ORDER,
    BACKENDS,
    BackendUnavailable,
    EngineInputError,
    create_engine,
)
from esp_retrieval.service.engine.cupy_backend import cuda_unavailable_reason
from esp_retrieval.subspace.engine.numpy_backend import NumpyBackend
from tests.service.engine.conftest import STARTABLE, layout_of, random_rows

LAYOUT = layout_of("three")
CORPUS = random_rows(200, LAYOUT, seed=11)


class Broken(NumpyBackend):
    name: ClassVar[str] = "broken"

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise BackendUnavailable("broken: no such device here")


@pytest.fixture
def with_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "broken", Broken)


def test_registry_names_every_backend() -> None:
    assert {"numpy", "torch", "faiss", "cupy"} <= set(BACKENDS)
    assert all(cls.name == name for name, cls in BACKENDS.items())
    for order in AUTO_ORDER.values():
        assert set(order) <= set(BACKENDS)


@pytest.mark.usefixtures("with_broken")
def test_a_backend_that_cannot_start_is_skipped_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.engine"):
        engine = create_engine("broken", CORPUS, LAYOUT, fallback=["numpy"])
    assert engine.name == "numpy"
    assert "broken: no such device here" in caplog.text


@pytest.mark.usefixtures("with_broken")
def test_the_chain_goes_on_past_several_failures(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.engine"):
        engine = create_engine("numpy", CORPUS, LAYOUT, precision="bfloat16", fallback=["broken", "torch"])
    assert (engine.name, engine.precision) == ("torch", "bfloat16")
    assert "numpy: precision 'bfloat16' is not supported" in caplog.text
    assert "broken: no such device here" in caplog.text


@pytest.mark.usefixtures("with_broken")
def test_when_nothing_starts_every_reason_is_reported() -> None:
    with pytest.raises(BackendUnavailable) as err:
        create_engine("broken", CORPUS, LAYOUT, precision="bfloat16", fallback=["numpy"])
    assert "broken: no such device here" in str(err.value)
    assert "numpy: precision 'bfloat16'" in str(err.value)


def test_auto_picks_the_first_backend_that_starts_and_logs_the_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    startable = {name for name, p in STARTABLE if p == "float32"}
    expected = next(name for name in AUTO_ORDER["float32"] if name in startable)
    with caplog.at_level(logging.INFO, logger="esp_retrieval.service.engine"):
        engine = create_engine("auto", CORPUS, LAYOUT)
    assert engine.name == expected
    reason = cuda_unavailable_reason()
    if reason is not None:
        assert reason in caplog.text  # e.g. "cupy: CUDA not available"
    assert f"engine backend {expected} started" in caplog.text


def test_cupy_says_why_it_cannot_start_here() -> None:
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is available: covered by test_gpu.py")
    with pytest.raises(BackendUnavailable, match=r"^cupy: "):
        BACKENDS["cupy"](CORPUS, LAYOUT)


def test_unknown_names_are_rejected_with_the_allowed_ones() -> None:
    with pytest.raises(EngineInputError, match="allowed") as err:
        create_engine("annoy", CORPUS, LAYOUT)
    assert err.value.field == "backend" and "numpy" in str(err.value)
    with pytest.raises(EngineInputError, match="float16") as err:
        create_engine("numpy", CORPUS, LAYOUT, precision="int4")
    assert err.value.field == "precision"


def test_created_engine_answers_and_warms_up() -> None:
    engine = create_engine("numpy", CORPUS, LAYOUT, threads=1)
    engine.warmup()
    assert (engine.num_docs, engine.dim, engine.precision, engine.threads) == (200, LAYOUT.dim, "float32", 1)
    res = engine.search(CORPUS[:2], np.ones(3), 1)
    np.testing.assert_array_equal(res.rows[:, 0], [0, 1])  # a row is its own nearest neighbour
