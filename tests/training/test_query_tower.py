"""Trunk mode ``query_top:N`` (training.query_tower): the query tower over cached hidden states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import build_tiny_model, tiny_train_config

QUERIES = ["cost of flooring", "flea life cycle", "facebook login", "what is the capital of france"]


def test_mode_parses_and_trains_the_top_layers(tiny_bert_dir: Path) -> None:
    from esp_retrieval.training.model import TrunkMode

    mode = TrunkMode.parse("query_top:1")
    assert (mode.kind, mode.top, mode.query_only, str(mode)) == ("query_top", 1, True, "query_top:1")
    assert not TrunkMode.parse("top:1").query_only
    for bad in ("query_top:0", "query_top", "query_top:x"):
        with pytest.raises(ValueError, match="'query_top:N'"):
            TrunkMode.parse(bad)
    model = build_tiny_model(tiny_bert_dir, trunk_mode="query_top:1")
    layers = model.trunk.model.encoder.layer
    assert all(p.requires_grad for p in layers[1].parameters())
    assert not any(p.requires_grad for p in (*layers[0].parameters(), *model.trunk.model.embeddings.parameters()))
    shared = {id(p) for p in model.shared_parameters()}
    assert {id(p) for p in layers[1].parameters()} <= shared
    with pytest.raises(ValueError, match="only 2 layers"):
        build_tiny_model(tiny_bert_dir, trunk_mode="query_top:3")


@pytest.mark.parametrize("top", [1, 2])
def test_untrained_tower_is_the_frozen_trunk(tiny_bert_dir: Path, top: int) -> None:
    from esp_retrieval.training.query_tower import QueryTower

    model = build_tiny_model(tiny_bert_dir, trunk_mode=f"query_top:{top}")
    frozen = model.trunk.encode(QUERIES)
    tower = QueryTower(model.trunk, fingerprint=None, batch_size=3)
    np.testing.assert_allclose(tower.encode(QUERIES), frozen, atol=1e-5, rtol=0)
    np.testing.assert_allclose(tower.encode(QUERIES, trained=False), frozen, atol=1e-5, rtol=0)
    # in batches of other sizes and orders (padding differs) the features are the same
    np.testing.assert_allclose(tower.encode(QUERIES[::-1], batch_size=1), frozen[::-1], atol=1e-5, rtol=0)


def test_a_step_trains_only_the_tower_and_leaves_the_passage_side(tiny_data_dir: Path, tiny_bert_dir: Path) -> None:
    from esp_retrieval.training.query_tower import TowerStore
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer

    trunk = {"path": str(tiny_bert_dir), "max_length": 32, "features_cache": None}
    optim = {"steps": 2, "lr": 0.01, "trunk_lr": 0.01, "warmup_steps": 0}
    frozen_cfg = tiny_train_config(tiny_data_dir, tiny_bert_dir, trunk={**trunk, "mode": "frozen"}, optim=optim)
    cfg = tiny_train_config(tiny_data_dir, tiny_bert_dir, trunk={**trunk, "mode": "query_top:1"}, optim=optim,
                            surgery={"name": "pcgrad", "params": {"seed": 0}})
    frozen = Trainer(build_run(frozen_cfg), frozen_cfg, progress=False)
    tr = Trainer(build_run(cfg), cfg, progress=False)
    store = tr.store
    assert isinstance(store, TowerStore)
    corpus, queries = tr.corpus_texts, sorted({t for task in tr.tasks for t in task.data.heldout.queries.values()})
    assert not any(store.is_query(t) for t in corpus) and all(store.is_query(t) for t in queries)
    # step 0: passages and queries are the frozen trunk's features
    np.testing.assert_array_equal(tr.pooled_np(corpus), frozen.pooled_np(corpus))
    np.testing.assert_allclose(tr.pooled_np(queries), frozen.pooled_np(queries), atol=1e-5, rtol=0)

    layers = tr.model.trunk.model.encoder.layer
    below = [p.detach().clone() for p in (*tr.model.trunk.model.embeddings.parameters(), *layers[0].parameters())]
    top = [p.detach().clone() for p in layers[1].parameters()]
    opt, _ = tr.optimizer()
    tr.model.train()
    rec = tr.step(1, opt)
    now_below = [p.detach() for p in (*tr.model.trunk.model.embeddings.parameters(), *layers[0].parameters())]
    assert all(torch.equal(a, b) for a, b in zip(below, now_below, strict=True))
    assert any(not torch.equal(a, p.detach()) for a, p in zip(top, layers[1].parameters(), strict=True))
    # the tower is shared: every query-side objective has a gradient on it, PCGrad sees each pair
    assert all(v["grad_norm"] > 0 for v in rec["tasks"].values())
    assert {tuple(p["tasks"]) for p in rec["pairs"]} == {("semantic", "entity"), ("semantic", "intent"),
                                                         ("entity", "intent")}
    # after the step: the passage side is unchanged, the queries moved
    np.testing.assert_array_equal(tr.pooled_np(corpus), frozen.pooled_np(corpus))
    assert not np.allclose(tr.pooled_np(queries), frozen.pooled_np(queries), atol=1e-5)
    # the untrained copy still gives the frozen features
    np.testing.assert_allclose(store.query_features_np(queries, trained=False), frozen.pooled_np(queries),
                               atol=1e-5, rtol=0)


def test_a_query_tower_is_not_exported_as_the_bundles_one_encoder(tiny_data_dir: Path, tiny_bert_dir: Path) -> None:
    """A bundle has one encoder, which also embeds documents (esp index, live upserts): a query-only
    tower would embed them unlike the corpus, so such a run is evaluation-only."""
    trunk = {"path": str(tiny_bert_dir), "mode": "query_top:1", "max_length": 32, "features_cache": None}
    with pytest.raises(ValueError, match="trunk.mode 'query_top:1' trains a query-only tower"):
        tiny_train_config(tiny_data_dir, tiny_bert_dir, trunk=trunk, export={"enabled": True})
    tiny_train_config(tiny_data_dir, tiny_bert_dir, trunk=trunk)  # export off: evaluation runs are fine
