"""Head kinds and initialisation: identity starts at the trunk, lexical at the corpus IDF, and the
query encoder reads both back to the same vectors; single_head concatenates the same heads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from encoder import QueryEncoder
from subspace.bundle import read_bundle
from subspace.lexical import HashedNgrams, idf
from tests.conftest import TINY_INTENT_CLASSES
from training.export import export_bundle
from training.model import ESPModel, HeadSpec, Trunk, TrunkMode


def _model(bert_dir: Path, architecture: str = "esp") -> ESPModel:
    trunk = Trunk.from_pretrained(bert_dir, max_length=64, mode=TrunkMode.parse("frozen"))
    h = trunk.hidden_size
    return ESPModel(
        trunk,
        {"semantic": h, "entity": 64, "intent": 8},
        architecture=architecture,
        adapter_hidden=16,
        intent_objective="intent",
        intent_classes=TINY_INTENT_CLASSES,
        head_specs={"semantic": HeadSpec(init="identity"), "entity": HeadSpec(kind="lexical")},
    )


def test_identity_head_starts_at_the_trunk_embedding(tiny_bert_dir: Path, tiny_corpus) -> None:
    model = _model(tiny_bert_dir)
    texts = tiny_corpus[1][:6]
    emb = model.encode(texts)
    pooled = model.trunk.encode(texts)
    want = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(emb[:, model.layout.slice("semantic")], want, atol=1e-5)


def test_identity_head_needs_the_trunk_width(tiny_bert_dir: Path) -> None:
    trunk = Trunk.from_pretrained(tiny_bert_dir, max_length=64, mode=TrunkMode.parse("frozen"))
    with pytest.raises(ValueError, match="identity"):
        ESPModel(trunk, {"semantic": trunk.hidden_size + 1}, head_specs={"semantic": HeadSpec(init="identity")})


def test_lexical_head_starts_at_the_corpus_idf(tiny_bert_dir: Path, tiny_corpus) -> None:
    model = _model(tiny_bert_dir)
    texts = tiny_corpus[1]
    model.init_lexical_idf(texts)
    head = model.heads["entity"]
    want = idf(HashedNgrams(64).counts(texts))
    np.testing.assert_allclose(torch.exp(head.log_weight).detach().numpy(), want, rtol=1e-5)
    # the lexical block is the IDF-weighted, normalised count vector
    counts = HashedNgrams(64).counts(texts[:3]) * want
    counts /= np.maximum(np.linalg.norm(counts, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose(model.encode(texts[:3])[:, model.layout.slice("entity")], counts, atol=1e-5)


@pytest.mark.parametrize("architecture", ["esp", "single_head"])
def test_query_encoder_reads_every_head_kind_back(
    tiny_bert_dir: Path, tiny_corpus, tmp_path: Path, architecture: str
) -> None:
    model = _model(tiny_bert_dir, architecture)
    ids, texts = tiny_corpus
    model.init_lexical_idf(texts)
    with torch.no_grad():  # move every head off its initialisation
        for p in model.heads.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = export_bundle(tmp_path / "bundle", model, ids, texts)
    b = read_bundle(path)
    enc = QueryEncoder.load(b.encoder_dir)
    assert enc.layout == model.layout
    np.testing.assert_allclose(enc.encode(texts[:8], batch_size=3), np.asarray(b.embeddings[:8]), atol=1e-5)
    if architecture == "single_head":
        assert list(enc.layout.names) == ["shared"]
        np.testing.assert_allclose(np.linalg.norm(np.asarray(b.embeddings[:8]), axis=1), 1.0, atol=1e-5)
