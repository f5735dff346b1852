"""A graceful stop that meets a rebalance (two members stopped together, a rolling restart).

Member A is ``ingest run`` (a process); member B is a bare ``GroupMember`` of the same
cooperative group, holding half the partitions. A is held after a Delta commit (fault
point ``after_delta_commit`` with a stall), gets SIGTERM, and while it is held B leaves:
the rebalance hands B's partitions to A while A is stopping. A must start no worker for
them (leaving the group hands them on), stop within its shutdown timeout and exit 0, and
the group must hold the offsets of everything A landed.

Found by chaos case coordinator-kill-rebalance (seed 200): before the fix, A started
workers for those partitions that nobody stopped, and the stop hung until the shutdown
deadline, then failed naming a batch that did not exist.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.membership.member import GroupMember
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, create_topic, produce
from ingest.testing.faults import fault_point_env
from tests.runtime.support import (
    Cli,
    assert_exact,
    config,
    group_offsets,
    records,
    row_count,
    wait_until,
    write_config,
)
from tests.supervisor.support import Recorder, client_config, group_config, pump_until

pytestmark = [pytest.mark.slow]

PARTITIONS = 4
STALL_S = 6.0


def test_partitions_assigned_while_stopping_start_no_worker_and_the_stop_ends_in_time(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={
            "source": {"assignors": ["cooperative-sticky"]},
            # Batches 3 s apart: the first takes every partition's first segments.
            "trigger": {"max_age": "3s", "shutdown_timeout": "20s"},
        },
    )
    first = 500
    produce(broker.bootstrap, topic, (r for p in range(PARTITIONS) for r in records(p, 0, first)))
    # The 2nd batch's Delta commit holds A for STALL_S: the batch of the second round.
    run = Cli(
        ["run", "-c", str(path)],
        tmp_path / "a.log",
        env=fault_point_env("after_delta_commit", 2, stall=STALL_S),
    )
    b: Recorder | None = None
    try:
        run.wait_for_event("worker_started", 60, count=PARTITIONS)
        wait_until(lambda: row_count(tmp_path / "table") == PARTITIONS * first, 90, "batch 1")
        member = GroupMember(client_config(broker.bootstrap), group_config(group), name="b")
        member.subscribe([topic])
        b = Recorder(member, "b")
        recorder = b
        pump_until([b], lambda: len(recorder.owned) == PARTITIONS // 2, 60, "b to take half")
        taken = frozenset(b.owned)

        assert "fault point after_delta_commit" not in run.text(), "batch 1 came in two"
        second = 300
        produce(
            broker.bootstrap,
            topic,
            (r for p in range(PARTITIONS) for r in records(p, first, second)),
        )
        wait_until(lambda: "fault point after_delta_commit #2" in run.text(), 60, "the hold")
        run.signal()  # SIGTERM while A is held: it is stopping from here on
        b.member.close()  # B leaves: the rebalance hands its partitions to A
        b = None
        assert run.wait(STALL_S + 20) == 0, run.text()[-4000:]
    finally:
        if b is not None:
            b.member.close()
        run.kill()
    log = run.text()
    # The handover came while A was stopping, and started nothing.
    assert "event=partitions_not_started" in log, log[-4000:]
    started = run.lines("worker_started")
    assert len(started) == PARTITIONS, started  # only the first four, none for B's two
    assert "shutdown_deadline_passed" not in log
    # What A owned and landed is committed; B's partitions (never landed by A) are as B
    # left them: B committed nothing, and a later run starts them from the table.
    cfg = config(path)
    kept = [Partition(topic, p) for p in range(PARTITIONS) if Partition(topic, p) not in taken]
    offsets = group_offsets(cfg, kept)
    assert all(o is not None and o >= first for o in offsets.values()), offsets
    # Nothing lost or duplicated: a second run lands the rest exactly.
    again = Cli(["run", "-c", str(path), "--until-end"], tmp_path / "again.log")
    try:
        assert again.wait(120) == 0, again.text()[-4000:]
    finally:
        again.kill()
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), first + second))
