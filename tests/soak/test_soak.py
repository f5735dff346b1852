"""A five-minute soak (tests/soak/run.py, ``scripts/soak``): continuous ingestion with a
worker SIGKILLed every minute and one broker restart ends exact, and after the warm-up the
run's memory, file descriptors, threads and handoff bytes stay flat.

Five minutes hold few samples after the warm-up, and two of the four swing by design:
delta-rs's I/O pool grows and shrinks threads with the reads of each batch (idle ones end
after 10 s), and the handoff holds zero to a few segments. So the bounds here are 10% for
memory, 5% for fds and 25% for threads and handoff bytes: a leak per worker restart or per
batch passes them within minutes (the thread growth issue 37 found was +106%). The
60-minute run (``scripts/soak --minutes 60``) is held to 5% on all four.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak.run import soak

WARM_UP = 0.2
BOUNDS = {"rss": 0.10, "fds": 0.05, "threads": 0.25, "handoff": 0.25}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_five_minutes_of_continuous_ingestion_stay_flat_and_exact(tmp_path: Path) -> None:
    result = soak(minutes=5, rate=5_000, kill_every=60, work=tmp_path)
    line = result.line(WARM_UP)
    print(line)
    assert not result.problems, (result.problems, line)
    assert result.kills >= 4 and result.broker_restarts == 1, line
    assert result.exit_code == 0 and result.exact, line
    growth = result.growth(WARM_UP)
    assert set(growth) == set(BOUNDS), line
    assert all(growth[name] <= bound for name, bound in BOUNDS.items()), line
