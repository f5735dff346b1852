"""A log truncated under the table by an unclean leader election, on the 3-node cluster.

A partition on two of the three nodes (``min.insync.replicas=1``, unclean election on):
1,000 records reach both replicas; the follower is killed and 500 more reach the leader
only. ``ingest run --until-end`` lands the 1,500 and commits offset 1,500 with the leader
epoch of its last record (KIP-320). Then the leader is killed and the stale follower
started: Kafka elects it uncleanly, at a new epoch, with a log of 1,000 records, and 300
new records go to offsets 1,000-1,299.

The next run restores offset 1,500 with its committed epoch. OffsetForLeaderEpoch says
the epoch now ends at 1,000: the log was truncated under the table. Under
``auto_offset_reset = "fail"`` the partition stops with the span named; nothing is
skipped or read again, and the table keeps its 1,500 rows.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from tests.runtime.support import config, row_count, write_config

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPLICATED = 1_000
LEADER_ONLY = 500
AFTER = 300


def _partition_view(admin: Any, topic: str) -> tuple[int, list[int], list[int]]:
    info = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    return info.leader, sorted(info.isrs), list(info.replicas)


def _wait(what: str, check: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # the cluster is mid-election: metadata may fail
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(0.5)


def _produce(bootstrap: str, topic: str, prefix: bytes, count: int) -> None:
    produce(
        bootstrap,
        topic,
        (ProducedRecord(prefix + b"%d" % i, partition=0) for i in range(count)),
        acks="all",
        enable_idempotence=False,
    )


def _committed_epoch(bootstrap: str, topic: str, group: str) -> tuple[int, int]:
    """(offset, leader epoch) the group committed, as librdkafka reads it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        consumer.close()
    return committed.offset, committed.leader_epoch


def test_a_log_truncated_under_the_table_stops_the_partition_under_fail(
    kafka_cluster: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    from confluent_kafka.admin import AdminClient

    kafka = kafka_cluster
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    create_topic(
        kafka.bootstrap,
        topic,
        partitions=1,
        replication_factor=2,
        config={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    leader, _, replicas = _partition_view(admin, topic)
    (follower,) = [r for r in replicas if r != leader]
    try:
        _produce(kafka.bootstrap, topic, b"a", REPLICATED)
        kafka.node(follower).kill()
        _wait("the ISR shrinks", lambda: _partition_view(admin, topic)[1] == [leader])
        _produce(kafka.bootstrap, topic, b"b", LEADER_ONLY)

        path = write_config(
            tmp_path / "run.toml",
            bootstrap=kafka.bootstrap,
            topic=topic,
            group=group,
            table=tmp_path / "table",
            sections={"source": {"auto_offset_reset": "fail"}},
        )
        # The first run reads no committed offset: "fail" would refuse to start it.
        cfg = config(path)
        first = dataclasses.replace(
            cfg, source=dataclasses.replace(cfg.source, auto_offset_reset="earliest")
        )
        outcome = group_run(first, until_end=True, spark=spark).run()
        assert outcome.exit_code == 0, outcome.message
        assert row_count(tmp_path / "table") == REPLICATED + LEADER_ONLY
        offset, epoch = _committed_epoch(kafka.bootstrap, topic, group)
        assert offset == REPLICATED + LEADER_ONLY
        assert epoch is not None and epoch >= 0  # the epoch of offset 1,499's batch

        kafka.node(leader).kill()
        kafka.node(follower).start()
        _wait("an unclean election", lambda: _partition_view(admin, topic)[0] == follower)
        _produce(kafka.bootstrap, topic, b"c", AFTER)

        outcome = group_run(cfg, until_end=True, spark=spark).run()
        assert outcome.exit_code != 0
        assert "truncated" in outcome.message, outcome.message
        assert f"Offsets {REPLICATED}-{REPLICATED + LEADER_ONLY - 1}" in outcome.message
        # Nothing skipped and nothing read again: the table is as the first run left it,
        # and the group's offset has not moved.
        assert row_count(tmp_path / "table") == REPLICATED + LEADER_ONLY
        assert _committed_epoch(kafka.bootstrap, topic, group) == (offset, epoch)
    finally:
        for node in kafka.nodes:
            if not node.running():
                node.start()
