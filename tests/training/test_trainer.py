"""Tiny-BERT training runs on the miniature data: losses fall, logs are complete, heads untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import tiny_train_config


def _mean_loss(history, name, sl):
    return float(np.mean([r["tasks"][name]["loss"] for r in history[sl]]))


@pytest.fixture(scope="module")
def frozen_run(tiny_data_dir: Path, tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from esp_retrieval.training.trainer import train

    cfg = tiny_train_config(
        tiny_data_dir,
        tiny_bert_dir,
        optim={"steps": 60, "lr": 0.01, "warmup_steps": 0},
        export={"enabled": True, "corpus": "trec"},
        sparse={"name": "bm25", "default_weight": 0.25},
    )
    out = tmp_path_factory.mktemp("run")
    return train(cfg, out, progress=False), out


def test_tiny_training_lowers_every_loss(frozen_run) -> None:
    result, _ = frozen_run
    for name in ("semantic", "entity", "intent"):
        first, last = (
            _mean_loss(result.history, name, slice(0, 10)),
            _mean_loss(result.history, name, slice(-10, None)),
        )
        assert last < first, (name, first, last)


def test_step_log_has_losses_lambdas_norms_and_pairs(frozen_run) -> None:
    _result, out = frozen_run
    lines = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "tasks" in r]
    assert len(steps) == 60
    rec = steps[-1]
    assert set(rec["tasks"]) == {"semantic", "entity", "intent"}
    assert all({"loss", "lambda", "grad_norm"} <= set(v) for v in rec["tasks"].values())
    assert [p["tasks"] for p in rec["pairs"]] == [
        ["semantic", "entity"],
        ["semantic", "intent"],
        ["entity", "intent"],
    ]
    assert all(-1.0001 <= p["cosine"] <= 1.0001 and isinstance(p["projected"], bool) for p in rec["pairs"])
    # DWA (window 5): uniform for the first two windows, then sums to K
    assert all(v["lambda"] == 1.0 for r in steps[:10] for v in r["tasks"].values())
    assert sum(v["lambda"] for v in steps[-1]["tasks"].values()) == pytest.approx(3.0, abs=1e-4)
    assert "heldout" in lines[-1]


def test_metrics_and_bundle(frozen_run) -> None:
    from esp_retrieval.subspace.bundle import read_bundle

    result, out = frozen_run
    assert set(result.metrics["start"]) == {"semantic", "entity", "intent"}
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(result.metrics))
    assert json.loads((out / "config.json").read_text())["architecture"] == "esp"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert result.metrics["final"]["semantic"]["n"] == 4  # the DL20 queries, held out
    b = read_bundle(result.bundle_path)
    assert b.manifest["training"]["config"]["architecture"] == "esp"
    assert set(b.manifest["training"]["data_hashes"]) == {
        "corpus",
        "semantic.train",
        "entity.train",
        "intent.train",
    }
    assert len(b.ids) == len(b.docs())


def test_heldout_queries_never_trained_on(tiny_data_dir: Path) -> None:
    from esp_retrieval.training.data.objectives import DataContext, Split, build_objective
    from esp_retrieval.training.data.trec import read_queries

    ctx = DataContext(tiny_data_dir, Split(by="year", heldout_year="dl20"))
    dl20 = set(read_queries(tiny_data_dir / "trec-dl-2019-2020-passage" / "queries.dl20.tsv").values())
    for kind in ("semantic", "entity"):
        data = build_objective(kind, ctx)
        assert not dl20 & set(data.train.anchors), kind
        assert set(data.heldout.queries.values()) <= dl20 | {
            q.text
            for q in __import__("esp_retrieval.training.data.dlhard", fromlist=["x"]).load_entity_queries(tiny_data_dir)
            if q.year == "dl20"
        }
    intent = build_objective("intent", ctx)
    assert not set(intent.train.texts) & set(intent.heldout.texts)


def test_heads_get_their_own_gradients_untouched(tiny_data_dir: Path, tiny_bert_dir: Path) -> None:
    """After surgery the shared grads change, but each head's grad is exactly grad(lambda_k * L_k)."""
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer

    cfg = tiny_train_config(
        tiny_data_dir,
        tiny_bert_dir,
        surgery={"name": "pcgrad", "params": {"seed": 0}},
        weighting={"name": "static", "params": {"weights": {"semantic": 2.0, "entity": 0.5}}},
        optim={"steps": 1, "grad_clip": None},
    )
    tr = Trainer(build_run(cfg), cfg, progress=False)
    model = tr.model
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves the weights as they are
    state = [t.batches for t in tr.tasks]
    import copy
    import itertools

    expected = {}
    lambdas = tr.weighting.weights()
    peeked = []
    for k, t in enumerate(tr.tasks):
        first = next(state[k])
        peeked.append(first)
        t.batches = itertools.chain([first], state[k])
        t_copy = copy.copy(t)
        t_copy.batches = iter([first])
        t_copy.rng = copy.deepcopy(t.rng)
        loss = t.loss(t_copy.output(model, tr.pooled))
        own = model.task_parameters(t.name)
        expected[t.name] = torch.autograd.grad(float(lambdas[k]) * loss, own)
    tr.step(1, opt)
    for t in tr.tasks:
        for p, g in zip(model.task_parameters(t.name), expected[t.name], strict=True):
            torch.testing.assert_close(p.grad, g)


def test_weighting_may_learn_parameters_and_see_gradient_norms(tiny_data_dir: Path, tiny_bert_dir: Path) -> None:
    """A weighting with its own parameters is stepped by the trainer's optimiser from ``combine``;
    ``observe_gradients`` sees the logged per-task norms; no trainer change is needed for either."""
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer
    from esp_retrieval.training.weighting.base import Weighting

    class Learned(Weighting):
        lr = 0.1

        def __init__(self, tasks):
            super().__init__(tasks)
            self.w = torch.nn.Parameter(torch.ones(self.k))
            self.seen: list[np.ndarray] = []

        def weights(self):
            return self.w.detach().double().numpy().copy()

        def parameters(self):
            return [self.w]

        def combine(self, losses):
            return (self.w * losses).sum()  # d/dw_k = L_k > 0: SGD lowers every weight

        def observe_gradients(self, norms):
            self.seen.append(norms)

    cfg = tiny_train_config(tiny_data_dir, tiny_bert_dir, optim={"steps": 3, "warmup_steps": 0})
    parts = build_run(cfg)
    parts.weighting = Learned([t.name for t in parts.tasks])
    tr = Trainer(parts, cfg, progress=False)
    opt, _ = tr.optimizer()
    assert any(p is parts.weighting.w for g in opt.param_groups for p in g["params"])
    recs = [tr.step(s, opt) for s in (1, 2)]
    assert (parts.weighting.w.detach() < 1).all()
    assert recs[1]["tasks"]["semantic"]["lambda"] < 1.0 == recs[0]["tasks"]["semantic"]["lambda"]
    for rec, norms in zip(recs, parts.weighting.seen, strict=True):
        assert [v["grad_norm"] for v in rec["tasks"].values()] == pytest.approx(norms.tolist(), abs=1e-5)


def test_the_bundle_carries_the_configured_bm25_block(frozen_run, tiny_data_dir: Path) -> None:
    from esp_retrieval.subspace.bundle import read_bundle
    from esp_retrieval.training.data.trec import iter_corpus
    from esp_retrieval.training.sparse_lexical import build_bm25

    result, _ = frozen_run
    b = read_bundle(result.bundle_path)
    assert list(b.sparse) == ["bm25"] and b.sparse_defaults == {"bm25": 0.25}
    block = b.sparse["bm25"]
    text_of = dict(iter_corpus(tiny_data_dir))
    # over the exported corpus' texts as embedded (docs.jsonl holds their repaired display form)
    want = build_bm25([text_of[i] for i in b.ids])
    assert block.vocab == want.vocab and block.params == want.params
    assert (block.docs != want.docs).nnz == 0
    assert b.weight_layout.names == (*b.layout.names, "bm25")


def test_the_bundle_carries_the_learned_term_weights(
        tiny_data_dir: Path, tiny_bert_dir: Path, tmp_path: Path) -> None:
    from esp_retrieval.subspace.bundle import read_bundle
    from esp_retrieval.training.trainer import train

    cfg = tiny_train_config(tiny_data_dir, tiny_bert_dir, optim={"steps": 0, "warmup_steps": 0},
                            export={"enabled": True, "corpus": "trec"},
                            sparse={"name": "bm25", "term_weights": {"steps": 50, "l2": 0.0}})
    result = train(cfg, tmp_path / "run", progress=False)
    block = read_bundle(result.bundle_path).sparse["bm25"]
    learned = block.params["term_weights"]
    assert learned["lists"] >= 1 and learned["loss_end"] < learned["loss_start"]
    assert any(t != 0 for t in learned["theta"])
    # still one exact dot product: the served scores are the block's own
    q = block.encode(["what is the capital of france", "1984 novel"])
    np.testing.assert_array_equal(block.scores(q), (q @ block.docs.T.astype(np.float64)).toarray())
