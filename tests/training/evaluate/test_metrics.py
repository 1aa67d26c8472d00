"""Benchmark-only metrics (entity mentions, agreement, tau, effective rank, fronts) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esp_retrieval.training.evaluate import metrics as m


def test_wikipedia_title_and_mentions() -> None:
    assert m.wikipedia_title("https://en.wikipedia.org/wiki/Talent_manager") == "talent manager"
    assert m.wikipedia_title("https://en.wikipedia.org/wiki/Mercury_(planet)") == "mercury"
    assert m.wikipedia_title("https://en.wikipedia.org/wiki/Caf%C3%A9") == "café"
    assert m.entity_mentioned("Bluetooth and WiFi compared", ["wifi"])
    assert m.entity_mentioned("The USPS. ships", ["usps"])
    assert not m.entity_mentioned("a shared workspace", ["space"])
    assert not m.entity_mentioned("anything", ["", "  "])


def test_intent_agreement() -> None:
    labels = ["n", "n", "t", "t", "n"]
    neighbours = np.array([[1, 2], [0, 4]])  # item 0 -> (n, t); item 1 -> (n, n)
    assert m.intent_agreement_at_k(labels, neighbours, [0, 1]) == pytest.approx(0.75)


def test_kendall_tau() -> None:
    # 5 concordant, 1 discordant pair of 6.
    assert m.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert m.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(m.kendall_tau([1, 1, 1], [1, 2, 3]))


def test_effective_rank() -> None:
    assert m.effective_rank(np.eye(5)) == pytest.approx(5.0)
    assert m.effective_rank(np.outer(np.arange(1, 4), np.arange(1, 6))) == pytest.approx(1.0)
    p = np.array([0.75, 0.25])
    assert m.effective_rank(np.diag([3.0, 1.0])) == pytest.approx(math.exp(-np.sum(p * np.log(p))))


def test_pareto_front_and_hypervolume() -> None:
    pts = np.array([[0.5, 0.5], [0.8, 0.2], [0.2, 0.9], [0.4, 0.4], [0.5, 0.5]])
    front = m.pareto_front(pts)
    assert sorted(front.tolist()) == [0, 1, 2, 4]
    assert pts[front, 0].tolist() == sorted(pts[front, 0].tolist())
    # Strips from the right: .8*.2 + .5*.3 + .2*.4
    assert m.hypervolume_2d(pts) == pytest.approx(0.39)
    # Only (0.5, 0.5) clears (0.3, 0.3) in both coordinates.
    assert m.hypervolume_2d(pts, ref=(0.3, 0.3)) == pytest.approx(0.2 * 0.2)
    assert m.hypervolume_2d(np.array([[0.1, 0.1]]), ref=(0.2, 0.0)) == 0.0
