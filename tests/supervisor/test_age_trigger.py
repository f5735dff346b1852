"""The age trigger starts a batch early by the time it is expected to take to land, so that
a record is visible about ``trigger.max_age`` after it came, not ``max_age`` plus the batch
(scripts/bench/latency.py measured p99 12.5 s at a 10 s trigger, 100k records/s, before)."""

from __future__ import annotations

import pytest

from ingest.supervisor.engine.batcher import age_trigger, next_cost

pytestmark = pytest.mark.quick

MB = 1_000_000


def test_a_batch_starts_earlier_by_the_lead_but_never_before_half_of_max_age() -> None:
    assert age_trigger(10.0, 0.0) == 10.0  # no batch landed yet: max_age itself
    assert age_trigger(10.0, 2.5) == 7.5
    assert age_trigger(10.0, 9.0) == 5.0  # at most half: batches at most twice as frequent
    assert age_trigger(1.0, 0.3) == pytest.approx(0.7)
    assert age_trigger(10.0, -1.0) == 10.0  # a clock step back is no lead


def test_the_cost_per_byte_follows_the_last_batches() -> None:
    cost = next_cost(None, 2.0, 100 * MB)
    assert cost * 100 * MB == pytest.approx(2.0)  # the first batch's own rate
    cost = next_cost(cost, 1.0, 25 * MB)  # 4 s for 100 MB at this one's rate
    assert cost * 100 * MB == pytest.approx(3.0)
    for _ in range(30):  # batches that got faster: the estimate comes down to them
        cost = next_cost(cost, 1.0, 100 * MB)
    assert cost * 100 * MB == pytest.approx(1.0, abs=1e-3)


def test_a_small_warm_up_batch_makes_the_next_start_early_not_late() -> None:
    # 8 records in 0.09 s: at that rate 100 MB would take far longer than max_age, so the
    # next batch starts at half of max_age, and lands before max_age.
    cost = next_cost(None, 0.09, 800)
    assert age_trigger(10.0, cost * 100 * MB) == 5.0
