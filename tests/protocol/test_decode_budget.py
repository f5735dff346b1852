"""One decode decompresses at most ``max_decode_bytes`` whatever the compression ratio:
a Fetch answer of tiny zstd batches of zeros (a compression bomb) is taken a few batches at
a time, each call's answer ending where the next Fetch starts, every record exactly once."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from ingest.client import ClientConfig, Cluster
from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.protocol.recordbatch.records import decode_records
from ingest.testing import KafkaCluster, create_topic, unique_name
from ingest.worker import FetchSettings, PartitionFetcher, StartPosition

MIB = 1024 * 1024


def _bombs(count: int, value_bytes: int, *, first_offset: int = 0) -> bytes:
    """``count`` zstd batches of one record each, a value of ``value_bytes`` zeros."""
    return b"".join(
        build_batch(
            [Record(value=b"\0" * value_bytes, key=b"k%d" % n, timestamp=1_000 + n)],
            base_offset=first_offset + n,
            compression="zstd",
        )
        for n in range(count)
    )


def test_an_answer_of_compression_bombs_is_decoded_a_budget_at_a_time() -> None:
    answer = _bombs(10, 8 * MIB)
    assert len(answer) < 10 * 2048  # about 1 KB on the wire for each 8 MiB value
    seen: list[int] = []
    offset = 0
    calls = 0
    while offset < 10:
        decoded = decode_records(
            answer, topic="t", partition=0, fetch_offset=offset, max_decode_bytes=20 * MIB
        )
        batch = decoded.batch
        offsets = batch.column(batch.schema.get_field_index("offset")).to_pylist()
        assert 1 <= len(offsets) <= 2  # 2 x 8 MiB fit in 20 MiB, a third would not
        assert decoded.next_offset == offsets[-1] + 1
        assert decoded.corrupt == ()
        seen += offsets
        offset = decoded.next_offset
        calls += 1
    assert seen == list(range(10)) and calls == 5


def test_the_first_batch_is_decoded_even_when_it_alone_is_over_the_budget() -> None:
    decoded = decode_records(
        _bombs(3, 8 * MIB), topic="t", partition=0, fetch_offset=0, max_decode_bytes=MIB
    )
    assert decoded.batch.num_rows == 1 and decoded.next_offset == 1


@pytest.mark.parametrize("budget", [None, 1024 * MIB])
def test_without_a_budget_or_within_it_the_whole_answer_is_decoded(budget: int | None) -> None:
    decoded = decode_records(
        _bombs(4, MIB, first_offset=100), topic="t", partition=0, max_decode_bytes=budget
    )
    assert decoded.batch.num_rows == 4 and decoded.next_offset == 104


def test_a_fetcher_on_kafka_takes_compression_bombs_a_budget_at_a_time(
    broker: KafkaCluster,
) -> None:
    """The worker's fetcher, on Apache Kafka: 12 zstd batches of 8 MiB of zeros each between
    small records, read with a 20 MiB budget: no poll decodes more than the budget, and every
    record comes once, in order."""
    topic = unique_name("t-bombs")
    create_topic(broker.bootstrap, topic, partitions=1)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "compression.type": "zstd",
            "message.max.bytes": 64 * MIB,
            "linger.ms": 0,
        }
    )
    sizes = []
    for n in range(12):
        for value in (b"small-%d" % n, b"\0" * (8 * MIB)):
            producer.produce(topic, value=value, partition=0)
            producer.flush(30)  # one record a batch
            sizes.append(len(value))
    settings = FetchSettings(max_wait_ms=20, max_decode_bytes=20 * MIB)
    decoded_per_poll: list[int] = []
    seen: list[int] = []
    with Cluster(ClientConfig(bootstrap_servers=broker.bootstrap)) as cluster:
        fetcher = PartitionFetcher(cluster, topic, 0, settings, start=StartPosition.earliest())
        deadline = time.monotonic() + 120
        while (fetcher.position or 0) < len(sizes):
            assert time.monotonic() < deadline, f"stuck at {fetcher.position}"
            result = fetcher.poll(prefetch=False)
            if result.batch is not None:
                values = result.batch.column("value").to_pylist()
                decoded_per_poll.append(sum(len(v) for v in values))
                seen += [len(v) for v in values]
    assert seen == sizes
    assert max(decoded_per_poll) <= 20 * MIB, decoded_per_poll
    assert len(decoded_per_poll) >= 6  # 12 bombs, at most 2 a poll
