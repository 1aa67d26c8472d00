"""The query encoder reads the folder training writes, and refuses a broken one by name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.encoder import EncoderError, QueryEncoder
from esp_retrieval.subspace import encoder_format
from esp_retrieval.subspace.bundle import read_bundle
from tests.conftest import TINY_INTENT_CLASSES


def test_encodes_as_the_bundle_was_embedded(tiny_bundle: Path, tiny_corpus) -> None:
    b = read_bundle(tiny_bundle)
    enc = QueryEncoder.load(b.encoder_dir)
    assert enc.layout == b.layout
    assert enc.intent_classes == TINY_INTENT_CLASSES
    vecs = enc.encode(tiny_corpus[1][:10], batch_size=3)
    assert vecs.dtype == np.float32 and vecs.shape == (10, b.layout.dim)
    np.testing.assert_allclose(vecs, np.asarray(b.embeddings[:10]), atol=1e-5)
    # the corpus is embedded by the document side, the same network in this format
    np.testing.assert_array_equal(enc.encode_documents(tiny_corpus[1][:10], batch_size=3), vecs)
    for name in b.layout.names:
        np.testing.assert_allclose(np.linalg.norm(vecs[:, b.layout.slice(name)], axis=1), 1.0, atol=1e-5)
    probs = enc.intent_probs(["how to bake bread", "facebook login"])
    assert probs.shape == (2, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    # deterministic: the same texts give the same vectors
    np.testing.assert_array_equal(enc.encode(tiny_corpus[1][:4]), enc.encode(tiny_corpus[1][:4]))


@pytest.fixture
def encoder_copy(tiny_bundle: Path, tmp_path: Path) -> Path:
    src = read_bundle(tiny_bundle).encoder_dir
    assert src is not None
    return Path(shutil.copytree(src, tmp_path / "encoder"))


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / encoder_format.CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: (d / encoder_format.CONFIG_FILE).unlink(), "missing (is"),
        (lambda d: (d / encoder_format.CONFIG_FILE).write_text("{not json", encoding="utf-8"), "not valid JSON"),
        (lambda d: (d / encoder_format.CONFIG_FILE).write_text("[1, 2]", encoding="utf-8"), "must be a JSON object"),
        (lambda d: _edit_config(d, format_version=encoder_format.FORMAT_VERSION + 1), "is not supported"),
        (lambda d: _edit_config(d, pooling="cls"), "pooling"),
    ],
    ids=["no-config", "not-json", "not-object", "future-version", "unknown-pooling"],
)
def test_a_broken_folder_is_refused_naming_what_is_wrong(encoder_copy: Path, breakage, message: str) -> None:
    breakage(encoder_copy)
    with pytest.raises(EncoderError, match=re.escape(message)) as info:
        QueryEncoder.load(encoder_copy)
    assert encoder_format.CONFIG_FILE in str(info.value)
