"""Each loss against a direct computation on small seeded tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from esp_retrieval.training.losses import LOSSES, TaskOutput, build_loss


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_info_nce_in_batch_and_hard_negatives() -> None:
    a, p, n = _unit(3, 4, seed=0), _unit(3, 4, seed=1), _unit(2, 4, seed=2)
    t = 0.1
    loss = build_loss("info_nce", temperature=t)
    direct = 0.0
    for i in range(3):
        logits = [float(a[i] @ p[j]) / t for j in range(3)]
        direct += -logits[i] + math.log(sum(math.exp(x) for x in logits))
    assert float(loss(TaskOutput(anchors=a, positives=p))) == pytest.approx(direct / 3, rel=1e-5)
    direct = 0.0
    for i in range(3):
        logits = [float(a[i] @ p[j]) / t for j in range(3)] + [float(a[i] @ n[j]) / t for j in range(2)]
        direct += -logits[i] + math.log(sum(math.exp(x) for x in logits))
    assert float(loss(TaskOutput(anchors=a, positives=p, negatives=n))) == pytest.approx(direct / 3, rel=1e-5)


def test_cross_entropy_with_class_weights() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [0.0, 0.0, 3.0]])
    labels = torch.tensor([0, 1, 2])
    w = [1.0, 2.0, 0.5]
    nll = [-float(torch.log_softmax(logits[i], 0)[labels[i]]) for i in range(3)]
    direct = sum(w[labels[i]] * nll[i] for i in range(3)) / sum(w[int(y)] for y in labels)
    got = build_loss("cross_entropy", class_weights=w)(TaskOutput(logits=logits, labels=labels))
    assert float(got) == pytest.approx(direct, rel=1e-6)
    assert float(build_loss("cross_entropy")(TaskOutput(logits=logits, labels=labels))) == pytest.approx(
        sum(nll) / 3, rel=1e-6
    )
    with pytest.raises(ValueError, match="class_weights"):
        build_loss("cross_entropy", class_weights=[1.0, -1.0])


def test_mse_and_bce_on_pair_cosines() -> None:
    a, p = _unit(4, 5, seed=3), _unit(4, 5, seed=4)
    y = torch.tensor([1.0, 0.0, 0.5, 1.0])
    cos = [float(a[i] @ p[i]) for i in range(4)]
    mse = sum((c - float(t)) ** 2 for c, t in zip(cos, y, strict=True)) / 4
    assert float(build_loss("mse")(TaskOutput(anchors=a, positives=p, targets=y))) == pytest.approx(
        mse, rel=1e-5
    )
    temp = 0.2
    bce = 0.0
    for c, t in zip(cos, y.tolist(), strict=True):
        s = 1 / (1 + math.exp(-c / temp))
        bce += -(t * math.log(s) + (1 - t) * math.log(1 - s))
    got = build_loss("bce", temperature=temp)(TaskOutput(anchors=a, positives=p, targets=y))
    assert float(got) == pytest.approx(bce / 4, rel=1e-5)


def test_registry_and_missing_fields() -> None:
    assert set(LOSSES) >= {"info_nce", "cross_entropy", "mse", "bce"}
    with pytest.raises(ValueError, match="allowed"):
        build_loss("triplet")
    with pytest.raises(ValueError, match="bad parameters"):
        build_loss("info_nce", margin=1.0)
    with pytest.raises(ValueError, match="needs the task output field 'positives'"):
        build_loss("info_nce")(TaskOutput(anchors=_unit(2, 3, seed=0)))
