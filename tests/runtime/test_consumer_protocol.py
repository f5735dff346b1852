"""``ingest run`` in a consumer-protocol group (KIP-848, ``source.group_protocol =
"consumer"``) on Apache Kafka: the coordinator assigns, reconciliation is incremental.

A second supervisor joins and later leaves: the first gives up half its partitions and
takes them back, and the workers of the partitions it keeps are never restarted (the
same worker processes throughout). Every record lands once, and the group's offsets
end at the end of each partition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, create_topic, produce, set_group_configs
from tests.runtime.support import (
    Cli,
    InProcess,
    assert_exact,
    config,
    group_offsets,
    records,
    row_count,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 8
# The group's own heartbeat interval and session (KIP-848: the coordinator's settings, per
# group); the harness's broker allows them (group.consumer.min.*).
HEARTBEAT_MS = 500
SESSION_MS = 6_000


def consumer_group_settings(bootstrap: str, group: str) -> None:
    set_group_configs(
        bootstrap,
        group,
        {"consumer.heartbeat.interval.ms": HEARTBEAT_MS, "consumer.session.timeout.ms": SESSION_MS},
    )


def describe(bootstrap: str, group: str) -> Any:
    """The group as librdkafka's admin client describes it (its type, assignor, members)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(timeout=30)


def produce_round(broker: KafkaCluster, topic: str, start: int, count: int) -> None:
    produce(
        broker.bootstrap,
        topic,
        (r for p in range(PARTITIONS) for r in records(p, start, count)),
        compression="lz4",
    )


def test_a_member_joining_and_leaving_moves_only_its_share_and_lands_every_record_once(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    consumer_group_settings(broker.bootstrap, group)
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"source": {"group_protocol": "consumer", "session_timeout": "6s"}},
    )
    produced = 2000
    produce_round(broker, topic, 0, produced)
    first = InProcess(group_run(config(path), spark=spark))
    try:
        wait_until(lambda: len(first.partitions()) == PARTITIONS, 60, "the first to own all")
        wait_until(
            lambda: row_count(tmp_path / "table") == PARTITIONS * produced, 90, "the first rows"
        )
        pids = {p: row["pid"] for p, row in first.partitions().items()}
        assert all(pids.values())
        from confluent_kafka import ConsumerGroupType

        described = describe(broker.bootstrap, group)
        # A consumer-protocol group, assigned by the coordinator's default assignor.
        assert described.type is ConsumerGroupType.CONSUMER, described.type
        assert described.partition_assignor == "uniform" and len(described.members) == 1

        second = Cli(["run", "-c", str(path)], tmp_path / "second.log")
        try:
            wait_until(lambda: len(first.partitions()) == PARTITIONS // 2, 60, "half moves")
            kept = first.partitions()
            # Incremental: the partitions it kept never stopped (same worker processes).
            assert {p: row["pid"] for p, row in kept.items()} == {p: pids[p] for p in kept}
            second.wait_for_event("worker_started", 60, count=PARTITIONS // 2)
            assert "protocol=consumer" in second.wait_for_event("joining", 5)
            assert len(describe(broker.bootstrap, group).members) == 2
            produce_round(broker, topic, produced, 3000)
            produced += 3000
            wait_until(
                lambda: row_count(tmp_path / "table") == PARTITIONS * produced,
                90,
                "both to land the second round",
            )
            second.signal()  # SIGTERM: it lands what it holds, commits and leaves
            assert second.wait(90) == 0, second.text()[-3000:]
        finally:
            second.kill()
        assert "event=left_group" in second.text()

        wait_until(lambda: len(first.partitions()) == PARTITIONS, 60, "the first to own all")
        after = first.partitions()
        assert {p: after[p]["pid"] for p in kept} == {p: pids[p] for p in kept}
        produce_round(broker, topic, produced, 1000)
        produced += 1000
        wait_until(lambda: row_count(tmp_path / "table") >= PARTITIONS * produced, 90, "every row")
        cfg = config(path)
        every = [Partition(topic, p) for p in range(PARTITIONS)]
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
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), produced))
