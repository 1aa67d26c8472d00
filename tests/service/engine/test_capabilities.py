"""Every registered backend declares its :class:`Capabilities`, and keeps what it declares."""

from __future__ import annotations

import pytest

from esp_retrieval.service.engine import BACKENDS, Backend, Capabilities


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_registered_backend_declares_its_capabilities(name: str) -> None:
    cls = BACKENDS[name]
    assert "capabilities" in vars(cls), f"{name} inherits its capabilities instead of declaring them"
    assert isinstance(cls.capabilities, Capabilities)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_declared_capability_comes_with_its_methods(name: str) -> None:
    cls, caps = BACKENDS[name], BACKENDS[name].capabilities
    assert (cls.documents is not Backend.documents) == caps.metadata
    assert (cls.upsert is not Backend.upsert) == caps.writes
    assert (cls.delete is not Backend.delete) == caps.writes
    if caps.writes:
        assert caps.metadata  # a written document's fields are the backend's to hold


def test_the_shipped_declarations() -> None:
    assert BACKENDS["milvus"].capabilities == Capabilities(
        native_filters=True, metadata=True, writes=True, approximate=True
    )
    for name in ("ivf", "pq"):  # approximate by their settings; both add the sparse blocks' term
        assert BACKENDS[name].capabilities == Capabilities(approximate=True, sparse=True), name
    for name in ("numpy", "torch"):  # the chunked scans add the sparse blocks' term
        assert BACKENDS[name].capabilities == Capabilities(sparse=True), name
    for name in ("faiss", "cupy"):
        assert BACKENDS[name].capabilities == Capabilities(), name
