"""Uncertainty weighting (Kendall et al. 2018): learned log-variances balance loss scales."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from esp_retrieval.training.weighting import WEIGHTINGS, build_weighting
from tests.conftest import tiny_train_config


def test_registered_and_validated() -> None:
    assert "uncertainty" in WEIGHTINGS
    w = build_weighting("uncertainty", ["a", "b"], regression=["b"])
    np.testing.assert_allclose(w.weights(), [1.0, 0.5])  # s = 0: exp(-s), exp(-s) / 2
    with pytest.raises(ValueError, match="unknown task.*valid: \\['a', 'b'\\]"):
        build_weighting("uncertainty", ["a", "b"], regression=["c"])
    with pytest.raises(ValueError, match="init"):
        build_weighting("uncertainty", ["a"], init=float("nan"))
    with pytest.raises(ValueError, match="lr"):
        build_weighting("uncertainty", ["a"], lr=0)


def test_total_matches_formula_and_its_loss_derivative_is_lambda() -> None:
    w = build_weighting("uncertainty", ["a", "b"], regression=["b"], init=0.3)
    losses = torch.tensor([2.0, 0.5], requires_grad=True)
    total = w.combine(losses)
    s = 0.3
    expected = math.exp(-s) * 2.0 + s / 2 + 0.5 * math.exp(-s) * 0.5 + s / 2
    assert float(total.detach()) == pytest.approx(expected, rel=1e-6)
    (grad,) = torch.autograd.grad(total, losses)
    np.testing.assert_allclose(grad.numpy(), w.weights(), rtol=1e-6)


def test_optimiser_moves_log_variances_to_balance_loss_scales() -> None:
    """Two tasks whose losses differ 80x: the large one's weight falls, the small one's rises,
    until each weighted loss is 1/2 (the minimum of exp(-s) L + s / 2)."""
    losses = torch.tensor([4.0, 0.05])
    w = build_weighting("uncertainty", ["big", "small"])
    opt = torch.optim.Adam(w.parameters(), lr=0.05)
    for _ in range(600):
        opt.zero_grad()
        w.combine(losses).backward()
        opt.step()
    s = w.log_vars.detach().numpy()
    assert s[0] > 0 > s[1]
    np.testing.assert_allclose(w.weights() * losses.numpy(), [0.5, 0.5], rtol=0.02)


def test_tiny_bert_run_trains_log_variances_and_logs_lambdas(
    tiny_data_dir: Path, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer, train

    cfg = tiny_train_config(
        tiny_data_dir,
        tiny_bert_dir,
        weighting={"name": "uncertainty", "params": {"lr": 0.05}},
        optim={"steps": 20, "lr": 0.01, "warmup_steps": 0},
    )
    # step by step: the log-variances are in the trainer's optimiser and the logged lambda is exp(-s)
    tr = Trainer(build_run(cfg), cfg, progress=False)
    opt, _ = tr.optimizer()
    w = tr.weighting
    assert any(p is w.log_vars for g in opt.param_groups for p in g["params"])
    for step in (1, 2, 3):
        s = w.log_vars.detach().clone()
        rec = tr.step(step, opt)
        logged = [rec["tasks"][t.name]["lambda"] for t in tr.tasks]
        np.testing.assert_allclose(logged, torch.exp(-s).numpy(), atol=1e-6)
        assert not torch.equal(w.log_vars.detach(), s)
    # end to end: train() with the step log, metrics and bundle
    result = train(cfg, tmp_path, progress=False)
    steps = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "tasks" in r]
    assert len(steps) == 20
    assert all(v["lambda"] == 1.0 for v in steps[0]["tasks"].values())  # s starts at 0
    names = list(steps[0]["tasks"])
    mean = {n: np.mean([r["tasks"][n]["loss"] for r in steps]) for n in names}
    last = steps[-1]["tasks"]
    assert all(last[n]["lambda"] != 1.0 for n in names)
    for n in names:  # each weight moves towards 1 / (2 L): down where L > 1/2, up where L < 1/2
        if min(r["tasks"][n]["loss"] for r in steps) > 0.5:
            assert last[n]["lambda"] < 1.0, (n, mean[n])
    biggest, smallest = max(names, key=mean.__getitem__), min(names, key=mean.__getitem__)
    assert last[biggest]["lambda"] < last[smallest]["lambda"]
    assert set(result.metrics["final"]) == set(names)
    assert json.loads((tmp_path / "config.json").read_text())["weighting"]["name"] == "uncertainty"
