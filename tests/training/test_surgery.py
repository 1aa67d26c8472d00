"""PCGrad (Yu et al. 2020) on hand-made gradients, checked against the formula."""

from __future__ import annotations

import pytest
import torch

from esp_retrieval.training.surgery import SURGERIES, build_surgery
from esp_retrieval.training.surgery.pcgrad import PCGrad, pcgrad


def _proj(g: torch.Tensor, onto: torch.Tensor) -> torch.Tensor:
    return g - torch.dot(g, onto) / torch.dot(onto, onto) * onto


def test_conflicting_2d() -> None:
    g1, g2 = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])
    out, projected = pcgrad(torch.stack([g1, g2]), [[1], [0]])
    # g1' = g1 - (-1/2) g2 = [0.5, 0.5]; g2' = g2 - (-1/1) g1 = [0, 1]
    torch.testing.assert_close(out, torch.tensor([0.5, 1.5]))
    assert projected.tolist() == [[False, True], [True, False]]
    combined, info = PCGrad().combine(torch.stack([g1, g2]))
    torch.testing.assert_close(combined, torch.tensor([0.5, 1.5]))
    assert info.cosine[0, 1] == pytest.approx(-1 / 2**0.5, abs=1e-6)


def test_aligned_and_orthogonal_are_plain_sums() -> None:
    for g1, g2 in (
        (torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0])),
        (torch.tensor([3.0, 0.0]), torch.tensor([0.0, -2.0])),
    ):
        out, projected = pcgrad(torch.stack([g1, g2]), [[1], [0]])
        torch.testing.assert_close(out, g1 + g2)
        assert not projected.any()


def test_three_tasks_fixed_order_matches_formula() -> None:
    g = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [-0.5, -1.0, 1.0]])
    orders = [[2, 1], [0, 2], [1, 0]]
    expected = torch.zeros(3)
    for i, order in enumerate(orders):
        gi = g[i].clone()
        for j in order:
            if torch.dot(gi, g[j]) < 0:
                gi = _proj(gi, g[j])
        expected += gi
    out, _ = pcgrad(g, orders)
    torch.testing.assert_close(out, expected)
    # the order matters for K = 3 (here): a different order gives a different result
    other, _ = pcgrad(g, [[1, 2], [2, 0], [0, 1]])
    assert not torch.allclose(other, out)


def test_pcgrad_order_is_seeded_for_k_above_2() -> None:
    a, b = PCGrad(seed=3), PCGrad(seed=3)
    assert [a.orders(4) for _ in range(5)] == [b.orders(4) for _ in range(5)]
    assert all(sorted(o) == [j for j in range(4) if j != i] for i, o in enumerate(a.orders(4)))


def test_sum_and_registry() -> None:
    g = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])
    out, info = build_surgery("sum").combine(g)
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0]))
    assert not info.projected.any()
    assert set(SURGERIES) >= {"sum", "pcgrad"}
    with pytest.raises(ValueError, match="allowed: \\[.*'pcgrad'.*'sum'.*\\]"):
        build_surgery("no_such_surgery")
