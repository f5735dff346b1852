"""Continuous runs with rebalances and crashes: a second supervisor joins and is killed,
workers die and restart, a partition that keeps crashing is marked failed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.output.metrics import Metrics
from ingest.supervisor.output.status import collect_status
from ingest.testing import KafkaCluster, create_topic, produce
from ingest.testing.faults import fault_point_env
from tests.runtime.support import (
    Cli,
    InProcess,
    assert_exact,
    broker_ends,
    config,
    group_offsets,
    records,
    row_count,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def produce_round(
    broker: KafkaCluster, topic: str, partitions: range, start: int, count: int
) -> None:
    produce(
        broker.bootstrap,
        topic,
        (r for p in partitions for r in records(p, start, count)),
        compression="lz4",
    )


def test_a_second_supervisor_joins_dies_before_committing_offsets_and_the_first_takes_over(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    partitions = range(8)
    create_topic(broker.bootstrap, topic, partitions=len(partitions))
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        # Cooperative only: retained partitions keep their workers through a rebalance.
        sections={"source": {"assignors": ["cooperative-sticky"]}},
    )
    produced = 2000
    produce_round(broker, topic, partitions, 0, produced)
    first = InProcess(group_run(config(path), spark=spark))
    try:
        wait_until(lambda: len(first.partitions()) == 8, 60, "the first supervisor to own all")
        wait_until(lambda: row_count(tmp_path / "table") == 8 * produced, 60, "the first rows")
        pids = {p: row["pid"] for p, row in first.partitions().items()}
        assert all(pids.values())

        # The second dies right after its first Delta commit, before committing offsets:
        # its rows are in the table, the group's offsets do not say so.
        crash = fault_point_env("after_delta_commit", 1)
        second = Cli(["run", "-c", str(path)], tmp_path / "second.log", env=crash)
        try:
            wait_until(lambda: len(first.partitions()) == 4, 60, "the first to give up half")
            kept = first.partitions()
            # Cooperative: the partitions it kept never stopped (same worker processes).
            assert {p: row["pid"] for p, row in kept.items()} == {p: pids[p] for p in kept}
            second.wait_for_event("worker_started", 60, count=4)
            group = collect_status(config(path))["group"]
            assert group["state"] == "Stable" and len(group["members"]) == 2
            produce_round(broker, topic, partitions, produced, 3000)
            produced += 3000
            assert second.wait(60) == -signal.SIGKILL, second.text()[-3000:]
        finally:
            second.kill()
        assert "fault point after_delta_commit #1: SIGKILL" in second.text()
        assert "event=batch_committed" in second.text()
        assert "event=offsets_committed" not in second.text()

        # Its session expires; the first takes every partition back and lands the rest.
        wait_until(lambda: len(first.partitions()) == 8, 60, "the first to own all again")
        after = first.partitions()
        assert {p: after[p]["pid"] for p in kept} == {p: pids[p] for p in kept}
        produce_round(broker, topic, partitions, produced, 1000)
        produced += 1000
        wait_until(lambda: row_count(tmp_path / "table") >= 8 * produced, 90, "every row")
        cfg = config(path)
        every = [Partition(topic, p) for p in partitions]
        wait_until(
            lambda: group_offsets(cfg, every) == dict.fromkeys(every, produced),
            30,
            "the commits of the last batch",
        )
        outcome = first.stop()
    finally:
        if first.alive:
            first.stop()
    assert outcome.exit_code == 0, outcome.message
    assert_exact(tmp_path / "table", dict.fromkeys(partitions, produced))
    assert broker_ends(cfg, every) == dict.fromkeys(every, produced)
    assert group_offsets(cfg, every) == dict.fromkeys(every, produced)


def test_a_crashed_worker_restarts_and_one_crashing_at_the_same_offset_is_marked_failed(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"worker": {"restart_backoff": "100ms", "max_restarts_at_same_offset": 2}},
    )
    produce_round(broker, topic, range(1), 0, 5000)  # partition 1 stays empty
    metrics = Metrics()
    run = InProcess(group_run(config(path), spark=spark, metrics=metrics))
    try:
        wait_until(lambda: row_count(tmp_path / "table") == 5000, 90, "the first rows")

        def worker_of(partition: int) -> int | None:
            row = run.partitions().get(partition)
            return None if row is None else row["pid"]

        # Partition 0: killed once, it restarts after what was sealed and carries on.
        victim = worker_of(0)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: worker_of(0) not in (None, victim), 30, "a new worker for partition 0")
        produce_round(broker, topic, range(1), 5000, 5000)

        # Partition 1 (empty, so always at offset 0): killed at every start.
        killed: set[int] = set()

        def kill_partition_1() -> bool:
            row = run.partitions()[1]
            if row["state"] == "failed":
                return True
            pid = row["pid"]
            if pid is not None and pid not in killed:
                killed.add(pid)
                os.kill(pid, signal.SIGKILL)
            return False

        wait_until(kill_partition_1, 60, "partition 1 to be marked failed")
        error = run.partitions()[1]["error"]
        assert "crashed 3 times at offset 0" in error and "SIGKILL" in error
        # The others keep going.
        produce_round(broker, topic, range(1), 10_000, 1000)
        wait_until(lambda: row_count(tmp_path / "table") == 11_000, 90, "partition 0's rows")
        outcome = run.stop()
    finally:
        if run.alive:
            run.stop()
    assert outcome.exit_code == 1
    assert f"{topic}-1: the worker crashed 3 times at offset 0" in outcome.message
    assert_exact(tmp_path / "table", {0: 11_000})
    labels = {"topic": topic}
    assert metrics.value("ingest_worker_restarts_total", partition=1, **labels) == 2
    assert metrics.value("ingest_worker_restarts_total", partition=0, **labels) == 1
    assert metrics.value("ingest_partition_failed", partition=1, **labels) == 1
    # The member's requests to the coordinator are exported: it joined, synced, heartbeat
    # and committed.
    for api in ("JoinGroup", "SyncGroup", "Heartbeat", "OffsetCommit"):
        assert metrics.value("ingest_group_requests_total", api=api) >= 1, api
    every = [Partition(topic, 0), Partition(topic, 1)]
    assert group_offsets(config(path), every)[Partition(topic, 0)] == 11_000
