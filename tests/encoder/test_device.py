"""Where the query encoder runs: CUDA when asked for ``auto`` and present, the CPU otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from esp_retrieval.encoder import EncoderError, QueryEncoder
from esp_retrieval.encoder.query_encoder import resolve_device
from esp_retrieval.subspace.bundle import read_bundle


def _cuda(monkeypatch: pytest.MonkeyPatch, present: bool, count: int = 1) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if present else 0)


def test_auto_picks_cuda_when_torch_sees_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, True, count=2)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("CPU") == "cpu"  # asking for the CPU on a GPU machine is honoured
    with pytest.raises(EncoderError, match="only 2 CUDA") as err:
        resolve_device("cuda:2")
    assert err.value.field == "device"


def test_auto_falls_back_to_the_cpu_and_explicit_cuda_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(EncoderError, match="no CUDA device") as err:
        resolve_device("cuda")
    assert err.value.field == "device"


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cpu:0", ""])
def test_unknown_devices_name_the_field(bad: str) -> None:
    with pytest.raises(EncoderError, match="allowed") as err:
        resolve_device(bad)
    assert err.value.field == "device"


def test_auto_on_this_machine_encodes_on_the_cpu_without_autocast(tiny_bundle: Path, tiny_corpus) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: covered by the gpu test below")
    b = read_bundle(tiny_bundle)
    assert b.encoder_dir is not None
    auto = QueryEncoder.load(b.encoder_dir, device="auto")
    assert auto.device.type == "cpu" and not auto.autocast
    texts = tiny_corpus[1][:6]
    np.testing.assert_array_equal(auto.encode(texts), QueryEncoder.load(b.encoder_dir).encode(texts))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_encoding_is_the_cpu_encoding_up_to_float16(tiny_bundle: Path, tiny_corpus) -> None:
    b = read_bundle(tiny_bundle)
    assert b.encoder_dir is not None
    gpu = QueryEncoder.load(b.encoder_dir, device="auto")
    assert gpu.device.type == "cuda" and gpu.autocast
    texts = tiny_corpus[1][:8]
    on_gpu, on_cpu = gpu.encode(texts), QueryEncoder.load(b.encoder_dir, device="cpu").encode(texts)
    assert on_gpu.dtype == np.float32
    for name in b.layout.names:  # still block-normalised, and the same directions
        sl = b.layout.slice(name)
        np.testing.assert_allclose(np.linalg.norm(on_gpu[:, sl], axis=1), 1.0, atol=1e-5)
        assert (np.sum(on_gpu[:, sl] * on_cpu[:, sl], axis=1) > 0.999).all()
