"""The verifier must see each kind of inexactness (else every chaos run would pass)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.testing.verify import verify_exact


def _rows(keys: list[tuple[int, int]], topic: str) -> pa.Table:
    return pa.table(
        {
            "topic": [topic] * len(keys),
            "partition": pa.array([p for p, _ in keys], pa.int32()),
            "offset": pa.array([o for _, o in keys], pa.int64()),
        }
    )


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def test_the_verifier_names_missing_duplicate_extra_and_committed_ahead(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(
        broker.bootstrap,
        topic,
        [ProducedRecord(b"v", partition=p) for p in (0, 1) for _ in range(5)],
    )
    table, dead = str(tmp_path / "table"), str(tmp_path / "dead")
    # Partition 0: offset 2 twice, 4 missing; partition 1: offset 3 dead-lettered, 9 extra.
    write_deltalake(table, _rows([(0, 0), (0, 1), (0, 2), (0, 2), (0, 3)], topic))
    write_deltalake(table, _rows([(1, 0), (1, 1), (1, 2), (1, 4), (1, 9)], topic), mode="append")
    write_deltalake(dead, _rows([(1, 3)], topic))
    _commit(broker.bootstrap, group, topic, {0: 5, 1: 5})

    verdict = verify_exact(broker.bootstrap, topic, group, table, dead_letter_uri=dead)
    text = verdict.describe()
    assert not verdict.exact
    assert f"{topic}/0: duplicate offsets in the table: 2" in text
    assert f"{topic}/0: missing offsets: 4" in text
    assert f"{topic}/0: committed offset 5 runs ahead of the table, which lacks 4" in text
    assert f"{topic}/1: table rows for offsets not in the topic: 9" in text
    assert f"{topic}/1: missing" not in text  # the dead letter accounts for offset 3
    assert (verdict.expected, verdict.rows, verdict.dead_letters) == (10, 10, 1)

    # The same check right after a crash ignores what is merely not landed yet.
    partial = verify_exact(
        broker.bootstrap, topic, group, table, dead_letter_uri=dead, require_complete=False
    )
    assert "missing offsets" not in partial.describe()
    assert "duplicate offsets" in partial.describe()


def test_an_exact_table_passes(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, [ProducedRecord(b"v", partition=0) for _ in range(3)])
    table = str(tmp_path / "table")
    write_deltalake(table, _rows([(0, 0), (0, 1), (0, 2)], topic))
    _commit(broker.bootstrap, group, topic, {0: 3})
    verdict = verify_exact(broker.bootstrap, topic, group, table)
    assert verdict.exact, verdict.describe()
    _commit(broker.bootstrap, group, topic, {0: 2})
    assert "short of the end 3" in verify_exact(broker.bootstrap, topic, group, table).describe()
