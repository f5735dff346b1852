"""The age trigger starts a batch early by the time it is expected to take to land, so that
a record is visible about ``trigger.max_age`` after it came, not ``max_age`` plus the batch
(scripts/bench/latency.py measured p99 12.5 s at a 10 s trigger, 100k records/s, before)."""

from __future__ import annotations

import pytest

from ingest.supervisor.engine.batcher import age_trigger, expected_seconds, next_means

pytestmark = pytest.mark.quick

MB = 1_000_000


def test_a_batch_starts_earlier_by_the_lead_but_never_before_half_of_max_age() -> None:
    assert age_trigger(10.0, 0.0) == 10.0  # no batch landed yet: max_age itself
    assert age_trigger(10.0, 2.5) == 7.5
    assert age_trigger(10.0, 9.0) == 5.0  # at most half: batches at most twice as frequent
    assert age_trigger(1.0, 0.3) == pytest.approx(0.7)
    assert age_trigger(10.0, -1.0) == 10.0  # a clock step back is no lead


def test_the_expected_time_follows_the_last_batches_rate() -> None:
    assert expected_seconds(None, 100 * MB) == 0.0  # nothing landed yet
    means = next_means(None, 2.0, 100 * MB)
    assert expected_seconds(means, 100 * MB) == pytest.approx(2.0)
    means = next_means(means, 2.0, 50 * MB)  # a slower one: 4 s for 100 MB
    assert expected_seconds(means, 100 * MB) == pytest.approx(4.0 / 1.5)
    for _ in range(30):  # batches that got faster: the estimate comes down to them
        means = next_means(means, 1.0, 100 * MB)
    assert expected_seconds(means, 100 * MB) == pytest.approx(1.0, abs=1e-3)


def test_a_small_warm_up_batch_moves_the_estimate_little() -> None:
    # 8 records in 0.09 s, then a batch of 100 MB in 2 s: the next 100 MB are expected to
    # take about what the large batch took, not what 0.09 s per 800 bytes would say.
    warm = next_means(None, 0.09, 800)
    assert age_trigger(10.0, expected_seconds(warm, 100 * MB)) == 5.0  # capped, until...
    means = next_means(warm, 2.0, 100 * MB)
    assert expected_seconds(means, 100 * MB) == pytest.approx(2.09, abs=0.01)
