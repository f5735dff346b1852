"""The partition lifecycle is a table: each row is the outcome, a missing row is a bug."""

from __future__ import annotations

import pytest

from ingest.protocol.partition import Partition
from ingest.supervisor.engine.partitions import LIFECYCLE, Change, PartitionState, Phase
from ingest.worker import StartPosition


def state(phase: Phase = Phase.IDLE) -> PartitionState:
    s = PartitionState(Partition("t", 0), 1, StartPosition.earliest(), None)
    s.phase = phase
    return s


@pytest.mark.parametrize(("row", "outcome"), sorted(LIFECYCLE.items(), key=str))
def test_each_row_is_what_change_does(row: tuple[Phase, Change], outcome: Phase) -> None:
    s = state(row[0])
    assert s.change(row[1], failure="why") is outcome and s.phase is outcome


@pytest.mark.parametrize(
    "row", [(p, c) for p in Phase for c in Change if (p, c) not in LIFECYCLE], ids=str
)
def test_a_pair_without_a_row_raises(row: tuple[Phase, Change]) -> None:
    s = state(row[0])
    with pytest.raises(AssertionError, match="no lifecycle row"):
        s.change(row[1])
    assert s.phase is row[0]


def test_nothing_restarts_a_stopped_finished_or_failed_partition() -> None:
    for phase in (Phase.STOPPING, Phase.FINISHED, Phase.FAILED):
        assert (phase, Change.SPAWN) not in LIFECYCLE
        assert (phase, Change.CRASH) not in LIFECYCLE


def test_the_first_failure_is_kept_and_shown() -> None:
    s = state(Phase.RUNNING)
    s.change(Change.FAIL, failure="broker fault")
    s.change(Change.STOP)
    assert s.failed == "broker fault" and s.status() == "failed"


def test_status_follows_the_phase_and_the_worker() -> None:
    s = state()
    assert s.status() == "idle"
    s.change(Change.SPAWN)
    s.change(Change.CRASH)
    s.restart_at = 5.0  # the engine sets when
    assert s.status() == "restarting"
    s.change(Change.STOP)
    assert s.status() == "stopped" and s.stopping and not s.finished
    assert s.restart_at is None  # a stopped partition has no restart due
    s.change(Change.FINISH)
    assert s.status() == "finished" and s.finished


def test_the_commit_target_of_a_finished_partition_is_its_end_once_all_landed() -> None:
    s = state(Phase.FINISHED)
    s.finished_next = 20_000
    s.durable_next = 19_998  # two control records follow the last row
    assert s.commit_target(in_flight=False) == 20_000
    assert s.commit_target(in_flight=True) == 19_998  # the batch may still fail


def test_a_revoked_finished_partition_commits_only_what_is_durable() -> None:
    """Its worker had fetched to the end, then the revocation dropped its pending
    segments unlanded (found by scripts/bench/scale.py: two ``--until-end`` hosts, the
    second joining while the first's Spark session started; the first committed the end
    of the partitions it gave up, and the new owner started there: rows lost)."""
    s = state(Phase.FINISHED)
    s.finished_next = 20_000
    s.abandon = True
    assert s.commit_target(in_flight=False) is None
    s.durable_next = 5_000
    assert s.commit_target(in_flight=False) == 5_000
