"""What an operator is told when Kafka's own tools touched the group (on Apache Kafka): a
group rewound with ``kafka-consumer-groups --reset-offsets`` is put back to the table's
offsets with a warning that names them and points to ``ingest replay``; a group whose members
offer only assignors ingest does not is refused with their protocol and the settings to
change."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions as GroupOffsets
from confluent_kafka.admin import AdminClient

from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, create_topic, produce, unique_name
from tests.runtime.support import (
    assert_exact,
    config,
    group_offsets,
    records,
    wait_until,
    write_config,
)

PARTITIONS = 2
PER_PARTITION = 300


def test_a_group_rewound_by_kafka_tools_is_put_back_with_a_warning(
    broker: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = unique_name("t-rewound"), unique_name("g-rewound")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    for p in range(PARTITIONS):
        produce(broker.bootstrap, topic, records(p, 0, PER_PARTITION))
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
    )
    first = group_run(config(path), until_end=True).run()
    assert first.exit_code == 0, first.message
    partitions = [Partition(topic, p) for p in range(PARTITIONS)]
    # What kafka-consumer-groups --reset-offsets --to-earliest --execute does.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    rewound = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    admin.alter_consumer_group_offsets([GroupOffsets(group, rewound)])[group].result(30)
    assert group_offsets(config(path), partitions) == dict.fromkeys(partitions, 0)

    with caplog.at_level(logging.WARNING, logger="ingest.supervisor"):
        again = group_run(config(path), until_end=True).run()
    assert again.exit_code == 0, again.message
    assert again.rows_written == 0  # exactly once: nothing landed twice
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), PER_PARTITION))
    repairs = [r for r in caplog.records if r.getMessage().startswith("commit_repair")]
    assert len(repairs) == 1, caplog.text
    said = repairs[0].getMessage()
    assert repairs[0].levelno == logging.WARNING
    assert f"{topic}-0" in said and str(PER_PARTITION) in said  # the table's offsets
    assert "reset-offsets" in said and "ingest replay" in said
    assert group_offsets(config(path), partitions) == dict.fromkeys(partitions, PER_PARTITION)


def test_a_group_of_members_ingest_cannot_join_names_their_assignor(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic, group = unique_name("t-inconsistent"), unique_name("g-inconsistent")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    theirs = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "partition.assignment.strategy": "roundrobin",
            "session.timeout.ms": 6000,
        }
    )
    try:
        theirs.subscribe([topic])
        wait_until(lambda: bool(theirs.poll(0.2) or theirs.assignment()), 60, "their join")
        path = write_config(
            tmp_path / "run.toml",
            bootstrap=broker.bootstrap,
            topic=topic,
            group=group,
            table=tmp_path / "table",
            sections={"source": {"assignors": ["cooperative-sticky"]}},
        )
        outcome = group_run(config(path), until_end=True).run()
    finally:
        theirs.close()
    assert outcome.exit_code == 1
    assert "INCONSISTENT_GROUP_PROTOCOL" in outcome.message
    assert "assignor 'roundrobin'" in outcome.message, outcome.message
    assert "source.assignors" in outcome.message and "cooperative-sticky" in outcome.message
