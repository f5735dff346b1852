"""Leader epochs from the records to the commit and back (KIP-320), on Apache Kafka.

A sealed segment carries the leader epoch of the batch holding its last offset, which
the OffsetCommit of its end records as ``committed_leader_epoch``. A position restored
with that epoch is validated with OffsetForLeaderEpoch: where the log ends the epoch
below the position, the log was truncated under it, and ``auto_offset_reset`` decides
(``fail``: ``LogTruncationError``; otherwise a logged error naming the span).

The one node restarted gives the partition a new leader epoch, so epoch 0 ends at the
offset where the restart came. A position past that end with epoch 0 is exactly what a
consumer holds after an unclean election truncated the log under it: the answer the
validation reads is the real broker's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ingest.client import ClientConfig, Cluster
from ingest.errors import LogTruncationError
from ingest.handoff import HandoffConfig, HandoffStore
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, ProducedRecord, TansuBroker, create_topic, produce
from ingest.worker import EndPosition, FetchSettings, PartitionFetcher, StartPosition
from ingest.worker.truncation import epoch_end_offset, validate_position
from tests.worker.support import read_segments, run_to_end, sealed, worker_settings

BEFORE = 3_000  # records produced in the first leader epoch
AFTER = 2_000  # and in the next


def _records(start: int, count: int) -> Iterator[ProducedRecord]:
    for n in range(start, start + count):
        yield ProducedRecord(b"v%d" % n + b"x" * 200, partition=0)


@pytest.fixture(scope="module")
def two_epochs(
    restartable_broker: KafkaCluster,
) -> Iterator[tuple[KafkaCluster, str, int, int]]:
    """The restartable one-node cluster (tests/conftest.py), where partition 0 of a topic
    has BEFORE records in one leader epoch and AFTER in the next: (kafka, topic, first
    epoch, second epoch)."""
    kafka = restartable_broker
    topic = "t-two-epochs"
    create_topic(kafka.bootstrap, topic, partitions=1)
    produce(kafka.bootstrap, topic, _records(0, BEFORE))
    with Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)) as cluster:
        cluster.refresh_metadata([topic])
        first = cluster.leader_epoch(topic, 0)
    kafka.restart(kill=True)  # the node leads again, at a new leader epoch
    produce(kafka.bootstrap, topic, _records(BEFORE, AFTER))
    with Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)) as cluster:
        cluster.refresh_metadata([topic])
        second = cluster.leader_epoch(topic, 0)
    assert 0 <= first < second, (first, second)
    yield kafka, topic, first, second


def _reference_epochs(bootstrap: str, topic: str) -> dict[int, int]:
    """offset -> leader epoch, as librdkafka reads them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "epochs-ref", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    epochs: dict[int, int] = {}
    try:
        while len(epochs) < BEFORE + AFTER:
            for message in consumer.consume(1000, timeout=5):
                assert message.error() is None, message.error()
                epochs[message.offset()] = message.leader_epoch()
    finally:
        consumer.close()
    return epochs


def test_each_segment_carries_the_epoch_of_its_last_record(
    two_epochs: tuple[KafkaCluster, str, int, int],
) -> None:
    kafka, topic, first, second = two_epochs
    with HandoffStore(HandoffConfig(segment_max_bytes=64 * 1024)) as store:
        settings = worker_settings(
            kafka.bootstrap,
            store,
            topic,
            end=EndPosition.latest(),
            fetch={"partition_max_bytes": 64 * 1024},
        )
        events, finished, _ = run_to_end(settings, store)
        segments = sealed(events)
        offsets = read_segments(store, segments).column("offset").to_pylist()
    assert offsets == list(range(BEFORE + AFTER)) and finished.next_offset == BEFORE + AFTER
    reference = _reference_epochs(kafka.bootstrap, topic)
    assert {reference[o] for o in range(BEFORE)} == {first}
    assert {reference[o] for o in range(BEFORE, BEFORE + AFTER)} == {second}
    assert len(segments) > 4
    assert [s.leader_epoch for s in segments] == [reference[s.next_offset - 1] for s in segments]
    assert {s.leader_epoch for s in segments} == {first, second}


def test_the_broker_ends_each_epoch_where_the_next_began(
    two_epochs: tuple[KafkaCluster, str, int, int],
) -> None:
    kafka, topic, first, second = two_epochs
    tp = Partition(topic, 0)
    with Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)) as cluster:
        cluster.refresh_metadata([topic])
        assert epoch_end_offset(cluster, tp, first) == (first, BEFORE)
        assert epoch_end_offset(cluster, tp, second) == (second, BEFORE + AFTER)


@pytest.mark.parametrize("position", [BEFORE - 1, BEFORE])
def test_a_position_the_epoch_still_holds_is_valid(
    two_epochs: tuple[KafkaCluster, str, int, int], position: int
) -> None:
    kafka, topic, first, _ = two_epochs
    with Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)) as cluster:
        cluster.refresh_metadata([topic])
        assert validate_position(cluster, Partition(topic, 0), position, first, "fail") is None


def test_a_position_past_the_end_of_its_epoch_fails_under_fail(
    two_epochs: tuple[KafkaCluster, str, int, int],
) -> None:
    kafka, topic, first, _ = two_epochs
    fetcher = PartitionFetcher(
        Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)),
        topic,
        0,
        FetchSettings(auto_offset_reset="fail"),
        start=StartPosition.offset(BEFORE + 500, leader_epoch=first),
    )
    try:
        with pytest.raises(LogTruncationError) as caught:
            fetcher.start()
    finally:
        fetcher.cluster.close()
    error = caught.value
    assert (error.first_offset, error.position) == (BEFORE, BEFORE + 500)
    assert f"Offsets {BEFORE}-{BEFORE + 499} were read into the table" in str(error)
    assert f"--from {BEFORE} --to latest" in str(error)


def test_a_position_past_the_end_of_its_epoch_is_logged_under_a_reset_policy(
    two_epochs: tuple[KafkaCluster, str, int, int], caplog: pytest.LogCaptureFixture
) -> None:
    kafka, topic, first, _ = two_epochs
    fetcher = PartitionFetcher(
        Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)),
        topic,
        0,
        FetchSettings(auto_offset_reset="earliest"),
        start=StartPosition.offset(BEFORE + 500, leader_epoch=first),
    )
    with caplog.at_level(logging.ERROR, logger="ingest.worker"):
        try:
            assert fetcher.start() == BEFORE + 500  # neither re-read nor skipped silently
        finally:
            fetcher.cluster.close()
    (record,) = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert f"Offsets {BEFORE}-{BEFORE + 499}" in record.getMessage()


def test_without_an_epoch_or_on_tansu_nothing_is_asked(
    two_epochs: tuple[KafkaCluster, str, int, int], tansu: TansuBroker, topic: str
) -> None:
    kafka, kafka_topic, _, _ = two_epochs
    with Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)) as cluster:
        cluster.refresh_metadata([kafka_topic])
        assert validate_position(cluster, Partition(kafka_topic, 0), 10**6, -1, "fail") is None
    create_topic(tansu.bootstrap, topic, partitions=1)
    produce(tansu.bootstrap, topic, _records(0, 10))
    with Cluster(ClientConfig(bootstrap_servers=tansu.bootstrap)) as cluster:
        cluster.refresh_metadata([topic])
        # Tansu offers no OffsetForLeaderEpoch: the position cannot be validated there.
        assert epoch_end_offset(cluster, Partition(topic, 0), 0) is None
        assert validate_position(cluster, Partition(topic, 0), 10**6, 0, "fail") is None
