"""The micro-batch cost model (esp_retrieval.service.search.cost) and the forecast built on it: a scan's fixed
cost is charged once per batch, so a queue that fits one batch is forecast as one scan."""

from __future__ import annotations

import asyncio
import time

import pytest

from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.search.cost import BatchCost, fit_batch_cost
from tests.service.search.test_batching import _batcher


def test_the_fit_recovers_a_fixed_and_a_per_query_cost() -> None:
    batches = [(n, 0.002 + 0.0001 * n) for n in (1, 1, 4, 8, 16, 1, 32)]
    cost = fit_batch_cost(batches)
    assert cost is not None and cost.fitted
    assert cost.fixed == pytest.approx(0.002) and cost.per_query == pytest.approx(0.0001)
    assert cost.queue(40, 2) == pytest.approx(2 * 0.002 + 40 * 0.0001)


def test_batches_of_one_size_keep_the_slope_measured_before_at_todays_level() -> None:
    before = fit_batch_cost([(1, 0.0021), (8, 0.0028)])
    assert before is not None and before.per_query == pytest.approx(0.0001)
    now = fit_batch_cost([(1, 0.0041)] * 5, before)  # a larger corpus since: the scan doubled
    assert now is not None and now.fitted
    assert now.per_query == pytest.approx(0.0001) and now.fixed == pytest.approx(0.004)


def test_without_a_shape_seen_every_query_is_charged_the_whole_batch() -> None:
    assert fit_batch_cost([]) is None
    assert fit_batch_cost([(2, 0.004)] * 3) == BatchCost(0.0, 0.002)  # the proportional model
    assert fit_batch_cost([(1, 0.003), (4, 0.002)]) == BatchCost(0.0025, 0.0, fitted=True)  # noise: no slope


def test_the_forecast_charges_the_scan_once_per_batch() -> None:
    async def run() -> None:
        b = _batcher(Metrics(), queue_size=1000, max_wait_ms=0, latency_budget_ms=50.0, max_batch=8)
        now = time.monotonic()
        b._batches.extend([(now, 1, 0.0021), (now, 8, 0.0028)])  # 2 ms a scan, 0.1 ms a query
        assert b.expected_wait(1, now) == pytest.approx(0.0021)
        assert b.expected_wait(8, now) == pytest.approx(0.0028)  # one batch, not eight scans
        assert b.expected_wait(9, now) == pytest.approx(2 * 0.002 + 9 * 0.0001)  # two batches

    asyncio.run(run())
