"""An OffsetCommit in flight never stalls the supervisor's loop: while its answer is held,
worker events are drained, segments sealed and batches landed; once it arrives, the group's
offsets catch up and the table is exact."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ingest.group import CommitFailed, OffsetsCommitted
from ingest.protocol.partition import Partition
from ingest.supervisor.engine.runtime import Engine
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, create_topic, produce
from tests.runtime.support import (
    InProcess,
    assert_exact,
    config,
    group_offsets,
    records,
    table_version,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 2


class HeldCommitAnswers:
    """Holds the outcomes of the engine's OffsetCommits (as a slow coordinator would) until
    ``release``: it wraps the group member's ``poll``, through which those outcomes reach
    the engine. The broker, the member and its requests are real."""

    def __init__(self, engine: Engine) -> None:
        self.held: list[Any] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        source: Any = engine.source
        start = source.start

        def start_and_wrap() -> None:
            start()
            poll = source.member.poll

            def held_poll(timeout: float) -> list[Any]:
                events = poll(timeout)
                with self._lock:
                    if not self.released.is_set():
                        kept = [e for e in events if isinstance(e, OffsetsCommitted | CommitFailed)]
                        self.held += kept
                        return [e for e in events if e not in kept]
                    out, self.held = [*self.held, *events], []
                    return out

            source.member.poll = held_poll

        source.start = start_and_wrap

    def count(self) -> int:
        with self._lock:
            return len(self.held)


def produce_range(broker: KafkaCluster, topic: str, start: int, count: int) -> None:
    produce(
        broker.bootstrap,
        topic,
        (r for p in range(PARTITIONS) for r in records(p, start, count)),
    )


def test_a_held_offset_commit_does_not_stop_batches_or_workers(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produce_range(broker, topic, 0, 2_000)
    table = tmp_path / "table"
    path = write_config(
        tmp_path / "run.toml", bootstrap=broker.bootstrap, topic=topic, group=group, table=table
    )
    engine = group_run(config(path), spark=spark)
    answers = HeldCommitAnswers(engine)
    run = InProcess(engine)
    try:
        wait_until(lambda: answers.count() >= 1, 120, "the first OffsetCommit answered (held)")
        version = table_version(table)
        partitions = [Partition(topic, p) for p in range(PARTITIONS)]
        before = {row: run.partitions()[row]["records"] for row in range(PARTITIONS)}
        produce_range(broker, topic, 2_000, 3_000)
        # The loop goes on: the workers' new segments are drained and land in a new batch.
        wait_until(
            lambda: table_version(table) > version, 60, "a batch landed while the commit was held"
        )
        after = {row: run.partitions()[row]["records"] for row in range(PARTITIONS)}
        assert all(after[p] > before[p] for p in range(PARTITIONS)), (before, after)
        # Still one commit in flight, and the group has not moved past the held one.
        assert engine.source.commits.in_flight is not None  # type: ignore[attr-defined]
        assert all(
            o is None or o <= 2_000 for o in group_offsets(config(path), partitions).values()
        )
        answers.released.set()
        wait_until(
            lambda: group_offsets(config(path), partitions) == dict.fromkeys(partitions, 5_000),
            60,
            "the offsets caught up once the answer came",
        )
    finally:
        outcome = run.stop()
    assert outcome.exit_code == 0, outcome.message
    assert_exact(str(table), dict.fromkeys(range(PARTITIONS), 5_000))
