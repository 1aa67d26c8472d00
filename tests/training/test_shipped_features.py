"""The features shipped in data/trunk-features are those of the installed MiniLM on the pool.

If the pinned model package, max_length or the corpus changed, the chunk keys would no longer
match and `esp train` would silently fall back to the 12-minute forward pass: this test says so
instead. Sampled rows are re-encoded with the installed model and must equal the shipped ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.training.config import load_config
from esp_retrieval.training.features import CHUNK, SHIPPED_DIR, chunk_name, trunk_fingerprint
from esp_retrieval.training.model import Trunk, TrunkMode
from esp_retrieval.training.run import data_context, default_trunk_path, load_corpus

pytestmark = pytest.mark.slow

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


@pytest.fixture(scope="module")
def minilm_and_pool() -> tuple[Trunk, list[str]]:
    cfg = load_config(DEMO_CONFIG)
    assert cfg.trunk.path is None and cfg.trunk.features_shipped and cfg.export.corpus == "trec"
    trunk = Trunk.from_pretrained(
        default_trunk_path(), max_length=cfg.trunk.max_length, mode=TrunkMode.parse("frozen")
    )
    return trunk, load_corpus(cfg, data_context(cfg))[1]


def test_every_pool_chunk_is_shipped_for_the_installed_model(minilm_and_pool: tuple[Trunk, list[str]]) -> None:
    trunk, texts = minilm_and_pool
    fp = trunk_fingerprint(trunk)
    names = [chunk_name(fp, texts[s : s + CHUNK]) for s in range(0, len(texts), CHUNK)]
    assert len(names) == 13
    assert sorted(names) == sorted(p.name for p in SHIPPED_DIR.glob("*.npy"))


def test_shipped_rows_equal_a_fresh_forward_pass(minilm_and_pool: tuple[Trunk, list[str]]) -> None:
    trunk, texts = minilm_and_pool
    fp = trunk_fingerprint(trunk)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(len(texts), size=12, replace=False))
    shipped = np.stack(
        [np.load(SHIPPED_DIR / chunk_name(fp, texts[r - r % CHUNK : r - r % CHUNK + CHUNK]))[r % CHUNK] for r in rows]
    )
    assert shipped.dtype == np.float32 and shipped.shape == (12, trunk.hidden_size)
    fresh = trunk.encode([texts[r] for r in rows])
    np.testing.assert_allclose(shipped, fresh, rtol=1e-4, atol=2e-5)


def test_long_passages_are_encoded_at_the_trunks_own_length(minilm_and_pool: tuple[Trunk, list[str]]) -> None:
    """The 3 longest pool passages (over 256 tokens) are shipped at max_length 256, not cut at 128."""
    trunk, texts = minilm_and_pool
    assert trunk.max_length == 256
    lengths = [len(x) for x in trunk.tokenizer(texts, truncation=False)["input_ids"]]
    rows = np.argsort(lengths)[-3:]
    assert min(lengths[r] for r in rows) > 256
    fp = trunk_fingerprint(trunk)
    shipped = np.stack(
        [np.load(SHIPPED_DIR / chunk_name(fp, texts[r - r % CHUNK : r - r % CHUNK + CHUNK]))[r % CHUNK] for r in rows]
    )
    np.testing.assert_allclose(shipped, trunk.encode([texts[r] for r in rows]), rtol=1e-4, atol=2e-5)
