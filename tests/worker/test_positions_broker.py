"""Starts and ends by time on real brokers: ListOffsets answers trusted on Apache Kafka,
checked on Tansu (``Cluster.trusts_list_offsets``, the ``kafka.list_offsets`` setting).

On Kafka a timestamp start is ListOffsets(T) as answered, and a timestamp end is
ListOffsets(T) too, so the end offset is known before the first Fetch. On Tansu, whose
answers are wrong (docs/kafka-compat.md), the start skips records before T and the end
cuts the records at T. The records read are the same on both.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ingest.client import ClientConfig, Cluster
from ingest.handoff import HandoffConfig, HandoffStore
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.worker import EndPosition, FetchSettings, StartPosition
from ingest.worker.positions import PositionResolver, Resolved
from tests.brokers import on_tansu
from tests.worker.support import read_segments, run_to_end, sealed, worker_settings

COUNT = 100
STEP_MS = 1000


@pytest.fixture
def store() -> Iterator[HandoffStore]:
    with HandoffStore(HandoffConfig()) as handoff:
        yield handoff


def stamped_topic(bootstrap: str, topic: str) -> int:
    """COUNT records one second apart, the last one 1 s before now, except offset 70:
    stamped before all of them (a late producer clock). Returns offset 0's timestamp."""
    create_topic(bootstrap, topic, partitions=1)
    base = int(time.time() * 1000) - COUNT * STEP_MS
    stamps = [base + i * STEP_MS for i in range(COUNT)]
    stamps[70] = base - 10 * STEP_MS
    produce(
        bootstrap,
        topic,
        [ProducedRecord(b"%d" % i, partition=0, timestamp_ms=t) for i, t in enumerate(stamps)],
    )
    return base


def resolver(cluster: Cluster, topic: str) -> PositionResolver:
    sizes = FetchSettings()
    return PositionResolver(
        cluster,
        Partition(topic, 0),
        sizes,
        lambda: (sizes.partition_max_bytes, sizes.max_bytes),
    )


def test_list_offsets_is_trusted_on_kafka_and_checked_on_tansu(
    any_broker: KafkaCluster, request: pytest.FixtureRequest
) -> None:
    with Cluster(ClientConfig(bootstrap_servers=any_broker.bootstrap)) as cluster:
        assert cluster.trusts_list_offsets() is not on_tansu(request)


@pytest.mark.parametrize("mode", ["trust", "check"])
def test_the_setting_overrides_the_detection(broker: KafkaCluster, mode: str) -> None:
    config = ClientConfig(bootstrap_servers=broker.bootstrap, list_offsets=mode)  # type: ignore[arg-type]
    with Cluster(config) as cluster:
        assert cluster.trusts_list_offsets() is (mode == "trust")


def test_time_bounds_resolve_by_list_offsets_where_trusted(
    any_broker: KafkaCluster, topic: str, request: pytest.FixtureRequest
) -> None:
    base = stamped_topic(any_broker.bootstrap, topic)
    start, end = base + 60 * STEP_MS + 500, base + 80 * STEP_MS
    with Cluster(ClientConfig(bootstrap_servers=any_broker.bootstrap)) as cluster:
        resolved = resolver(cluster, topic).resolve(
            StartPosition.timestamp(start), EndPosition.timestamp(end)
        )
    if on_tansu(request):
        # Answers checked: the records are skipped before the start and cut at the end.
        assert resolved.skip_before_timestamp == start and resolved.end_timestamp == end
        assert resolved.end_offset == COUNT and resolved.position <= 61
    else:
        # The first record at or after each bound, as answered: offset 70 (stamped early)
        # does not count, it is not the first at or after either.
        assert resolved == Resolved(position=61, end_offset=80)


def test_time_bounds_read_the_same_records_on_each_broker(
    any_broker: KafkaCluster, topic: str, store: HandoffStore
) -> None:
    base = stamped_topic(any_broker.bootstrap, topic)
    settings = worker_settings(
        any_broker.bootstrap,
        store,
        topic,
        start=StartPosition.timestamp(base + 60 * STEP_MS + 500),
        end=EndPosition.timestamp(base + 80 * STEP_MS),
    )
    events, finished, _ = run_to_end(settings, store)
    table = read_segments(store, sealed(events))
    # 61-79, 70 included: it comes after the first record at the start (Kafka's rule).
    assert table.column("offset").to_pylist() == list(range(61, 80))
    assert finished.next_offset == 80


def test_an_end_time_past_every_record_ends_at_the_latest_offset(
    broker: KafkaCluster, topic: str
) -> None:
    base = stamped_topic(broker.bootstrap, topic)
    with Cluster(ClientConfig(bootstrap_servers=broker.bootstrap)) as cluster:
        resolved = resolver(cluster, topic).resolve(
            StartPosition.timestamp(base + COUNT * STEP_MS + 60_000),
            EndPosition.timestamp(base + COUNT * STEP_MS + 60_000),
        )
    # No record at or after either bound: both are the end of the partition.
    assert resolved == Resolved(position=COUNT, end_offset=COUNT)
