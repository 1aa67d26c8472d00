"""Head kinds and initialisation: identity starts at the trunk, lexical at the corpus IDF, pca at
the principal directions of the objective's texts (intent prototypes at the class means), and the
query encoder reads every kind back to the same vectors; single_head concatenates the same heads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from esp_retrieval.encoder import QueryEncoder
from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.subspace.lexical import HashedNgrams, idf
from esp_retrieval.training.export import export_bundle
from esp_retrieval.training.model import ESPModel, HeadSpec, Trunk, TrunkMode
from tests.conftest import TINY_INTENT_CLASSES


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
        head_specs={"semantic": HeadSpec(init="identity"), "entity": HeadSpec(kind="lexical"),
                    "intent": HeadSpec(init="pca", normalize_input=True)},
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


def test_pca_head_starts_at_the_principal_directions_and_class_means(tiny_bert_dir: Path, tiny_corpus) -> None:
    model = _model(tiny_bert_dir)
    texts = tiny_corpus[1][:24]
    labels = [i % len(TINY_INTENT_CLASSES) for i in range(len(texts))]
    feats = torch.from_numpy(model.text_features(texts))
    model.init_pca("intent", feats, labels)
    w = model.heads["intent"].linear.weight.detach().numpy()
    np.testing.assert_allclose(w @ w.T, np.eye(w.shape[0]), atol=1e-5)  # orthonormal rows
    # the rows span the top principal subspace of the normalised, centred inputs
    x = model.trunk.encode(texts)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    x -= x.mean(0)
    top = np.linalg.svd(x, full_matrices=False)[2][: w.shape[0]]
    np.testing.assert_allclose(np.abs(np.linalg.det(top @ w.T)), 1.0, atol=1e-4)
    # centred: the head's outputs average to zero; prototypes are the normalised class means
    z_raw = model.heads["intent"](model.adapter(feats[:, : model.trunk.hidden_size]), None).detach()
    np.testing.assert_allclose(z_raw.mean(0).numpy(), 0.0, atol=1e-5)
    z = model.objective_vector(feats, "intent").detach()
    for c in range(len(TINY_INTENT_CLASSES)):
        mean = z[torch.tensor(labels) == c].mean(0)
        np.testing.assert_allclose(model.prototypes[c].detach().numpy(), (mean / mean.norm()).numpy(), atol=1e-5)


def test_normalize_input_makes_a_head_blind_to_the_pooled_norm(tiny_bert_dir: Path, tiny_corpus) -> None:
    model = _model(tiny_bert_dir)
    model.init_lexical_idf(tiny_corpus[1])
    feats = torch.from_numpy(model.text_features(tiny_corpus[1][:5]))
    scaled = feats.clone()
    scaled[:, : model.trunk.hidden_size] *= torch.linspace(0.5, 3.0, 5)[:, None]
    with torch.no_grad():  # a non-zero bias, so only input normalisation can cancel the scale
        model.heads["intent"].linear.bias.add_(0.3)
        torch.testing.assert_close(model.objective_vector(scaled, "intent"), model.objective_vector(feats, "intent"))
        model.heads["intent"].normalize_input = False
        assert not torch.allclose(model.objective_vector(scaled, "intent"), model.objective_vector(feats, "intent"))


def test_pca_init_needs_a_linear_head_and_enough_texts(tiny_bert_dir: Path, tiny_corpus) -> None:
    model = _model(tiny_bert_dir)
    feats = torch.from_numpy(model.text_features(tiny_corpus[1][:4]))
    with pytest.raises(ValueError, match="linear head"):
        model.init_pca("entity", feats)
    with pytest.raises(ValueError, match="at least dim = 8"):
        model.init_pca("intent", feats)
