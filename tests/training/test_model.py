"""Trunk modes, shared vs task parameters, single-head baseline, encode/intent shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_DIMS, build_tiny_model, tiny_train_config


def test_trunk_modes_choose_trainable_layers(tiny_bert_dir: Path) -> None:
    from esp_retrieval.training.model import TrunkMode

    frozen = build_tiny_model(tiny_bert_dir, trunk_mode="frozen")
    assert frozen.trunk.trainable_parameters() == []
    assert {id(p) for p in frozen.shared_parameters()} == {id(p) for p in frozen.adapter.parameters()}
    top = build_tiny_model(tiny_bert_dir, trunk_mode="top:1")
    layers = top.trunk.model.encoder.layer
    assert all(p.requires_grad for p in layers[1].parameters())
    assert not any(p.requires_grad for p in layers[0].parameters())
    assert not any(p.requires_grad for p in top.trunk.model.embeddings.parameters())
    full = build_tiny_model(tiny_bert_dir, trunk_mode="full")
    assert all(p.requires_grad for p in full.trunk.model.parameters())
    for bad in ("top:0", "top", "half"):
        with pytest.raises(ValueError, match="allowed: 'frozen', 'full', 'top:N'"):
            TrunkMode.parse(bad)
    with pytest.raises(ValueError, match="only 2 layers"):
        build_tiny_model(tiny_bert_dir, trunk_mode="top:3")


def test_esp_and_single_head_layouts_and_parameter_groups(tiny_bert_dir: Path) -> None:
    esp = build_tiny_model(tiny_bert_dir)
    assert esp.layout.names == tuple(TINY_DIMS) and esp.layout.dim == 32
    head_ids = {id(p) for p in esp.task_parameters("semantic")}
    assert head_ids == {id(p) for p in esp.heads["semantic"].parameters()}
    assert id(esp.prototypes) in {id(p) for p in esp.task_parameters("intent")}
    single = build_tiny_model(tiny_bert_dir, architecture="single_head")
    assert single.layout.names == ("shared",) and single.layout.dim == 32
    # the same heads as ESP, but every loss reads their concatenation: all of them are shared
    assert set(single.heads) == set(TINY_DIMS)
    assert {id(p) for p in single.heads.parameters()} <= {id(p) for p in single.shared_parameters()}
    assert single.task_parameters("semantic") == []
    texts = ["cost of flooring", "flea life cycle", "facebook login"]
    for model in (esp, single):
        emb = model.encode(texts)
        assert emb.shape == (3, 32) and emb.dtype == np.float32
        for obj in model.layout:
            np.testing.assert_allclose(np.linalg.norm(emb[:, obj.offset : obj.end], axis=1), 1.0, atol=1e-5)
        probs = model.intent_probs(texts)
        np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)


def test_top_mode_trains_only_the_top_layer(tiny_data_dir: Path, tiny_bert_dir: Path) -> None:
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer

    cfg = tiny_train_config(
        tiny_data_dir,
        tiny_bert_dir,
        trunk={"path": str(tiny_bert_dir), "mode": "top:1", "max_length": 32, "features_cache": None},
        optim={"steps": 2, "lr": 0.01, "trunk_lr": 0.01, "warmup_steps": 0},
    )
    tr = Trainer(build_run(cfg), cfg, progress=False)
    layers = tr.model.trunk.model.encoder.layer
    before = [p.detach().clone() for p in (*layers[0].parameters(), *layers[1].parameters())]
    opt, _ = tr.optimizer()
    rec = tr.step(1, opt)
    after = [p.detach() for p in (*layers[0].parameters(), *layers[1].parameters())]
    n0 = len(list(layers[0].parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before[:n0], after[:n0], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before[n0:], after[n0:], strict=True))
    assert all(v["grad_norm"] > 0 for v in rec["tasks"].values())


@pytest.mark.parametrize("mode", ["frozen", "top:1"])
def test_build_run_starts_pca_heads_from_the_objective_training_texts(
    tiny_data_dir: Path, tiny_bert_dir: Path, mode: str
) -> None:
    from esp_retrieval.training.run import build_run

    cfg = tiny_train_config(tiny_data_dir, tiny_bert_dir, adapter_hidden=None)
    objectives = [o.model_dump() for o in cfg.objectives]
    objectives[2]["head"] = {"init": "pca", "normalize_input": True}
    cfg = tiny_train_config(
        tiny_data_dir, tiny_bert_dir, adapter_hidden=None, objectives=objectives,
        trunk={"path": str(tiny_bert_dir), "mode": mode, "max_length": 48, "features_cache": None},
    )
    parts = build_run(cfg)
    model, intent = parts.model, next(t for t in parts.tasks if t.intent)
    texts, labels = intent.data.train.init_rows()
    assert labels is not None
    with torch.no_grad():
        z = model.objective_vector(model.pooled(texts), "intent")
        # every prototype is its class mean: the untrained classifier is nearest-centroid
        for c in set(labels):
            mean = z[torch.tensor(labels) == c].mean(0)
            torch.testing.assert_close(model.prototypes[c], mean / mean.norm(), atol=1e-5, rtol=0)
