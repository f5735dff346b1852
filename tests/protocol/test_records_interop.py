"""Interop: batches that confluent-kafka (librdkafka) produced to the real test broker.

The raw batches come from our own Fetch request over a plain socket; decoded,
they must equal what confluent-kafka's consumer reads from the same topic.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import pyarrow as pa
import pytest

from ingest.protocol.codec import decode_response, encode_request
from ingest.protocol.messages.fetch import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
)
from ingest.protocol.recordbatch.records import (
    CONTROL_ABORT,
    DecodedRecords,
    control_marker,
    decode_records,
)
from ingest.testing import (
    CODECS,
    ConsumedRecord,
    KafkaCluster,
    ProducedRecord,
    Transaction,
    create_topic,
    produce,
    produce_transactions,
    read_topic,
)

FETCH_VERSION = 11
T0 = 1_700_000_000_000


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            raise EOFError("broker closed the connection")
        out += chunk
    return bytes(out)


def fetch_partition(
    bootstrap: str, topic: str, partition: int, *, read_committed: bool = False
) -> list[DecodedRecords]:
    """Fetches a partition from offset 0 to its end, the way a consumer would."""
    host, port = bootstrap.rsplit(":", 1)
    decoded: list[DecodedRecords] = []
    offset = 0
    # Small, so a Kafka broker cuts answers inside batches; Tansu 0.6.0 ignores max_bytes
    # and sends whole partitions (partial batches are covered in test_records.py).
    max_bytes = 64 * 1024
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        for correlation_id in range(1, 500):
            request = FetchRequest(
                max_wait_ms=50,
                min_bytes=1,
                max_bytes=max_bytes,
                isolation_level=1 if read_committed else 0,
                topics=(
                    FetchTopic(
                        topic=topic,
                        partitions=(
                            FetchPartition(
                                partition=partition,
                                fetch_offset=offset,
                                partition_max_bytes=max_bytes,
                            ),
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            )
            sock.sendall(
                encode_request(
                    request, version=FETCH_VERSION, correlation_id=correlation_id, client_id="t"
                )
            )
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            _, response = decode_response(1, FETCH_VERSION, _recv_exactly(sock, size))
            assert isinstance(response, FetchResponse)
            data = response.responses[0].partitions[0]
            assert data.error_code == 0
            end = data.last_stable_offset if read_committed else data.high_watermark
            if offset >= end:
                return decoded
            result = decode_records(
                data.records or b"",
                topic=topic,
                partition=partition,
                read_committed=read_committed,
                aborted_transactions=[
                    (txn.producer_id, txn.first_offset) for txn in data.aborted_transactions or ()
                ],
                fetch_offset=offset,
            )
            assert result.corrupt == ()
            decoded.append(result)
            if result.next_offset is not None:
                offset = result.next_offset
            elif result.incomplete_batch_size is not None:
                max_bytes = max(max_bytes * 2, result.incomplete_batch_size)
    raise AssertionError(f"{topic}/{partition} never reached its end")


def as_consumed(topic: str, decoded: list[DecodedRecords]) -> list[ConsumedRecord]:
    out = []
    for part in decoded:
        table = part.batch
        timestamps = table.column("timestamp").cast(pa.int64()).to_pylist()
        for row, timestamp in zip(table.to_pylist(), timestamps, strict=True):
            out.append(
                ConsumedRecord(
                    topic=row["topic"],
                    partition=row["partition"],
                    offset=row["offset"],
                    timestamp_ms=timestamp,
                    timestamp_type=row["timestamp_type"],
                    key=row["key"],
                    value=row["value"],
                    headers=[(h["key"], h["value"]) for h in row["headers"]],
                )
            )
    assert all(r.topic == topic for r in out)
    return out


def read_all(
    broker: KafkaCluster, topic: str, partitions: int, **kwargs: Any
) -> list[ConsumedRecord]:
    out: list[ConsumedRecord] = []
    for partition in range(partitions):
        out += as_consumed(topic, fetch_partition(broker.bootstrap, topic, partition, **kwargs))
    return out


def varied_records(count: int, partitions: int, tag: str) -> list[ProducedRecord]:
    out = []
    for i in range(count):
        value: bytes | None = f"{tag}-{i}-".encode() * (1 + i % 40)
        if i % 17 == 0:
            value = None
        elif i % 19 == 0:
            value = b""
        elif i == 5:
            value = bytes(range(256)) * 1200  # ~300 KB, larger than one fetch
        out.append(
            ProducedRecord(
                value=value,
                key=None if i % 6 == 0 else f"key-{i % 50}".encode(),
                partition=i % partitions,
                headers=[("trace", f"{i}".encode()), ("nothing", None)] if i % 4 == 0 else None,
                timestamp_ms=T0 + i * 7,
            )
        )
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_batches_decode_like_librdkafka_reads_them(
    broker: KafkaCluster, topic: str, codec: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    # Two produce rounds, so each partition holds several batches.
    produce(broker.bootstrap, topic, varied_records(300, 2, "a"), compression=codec)
    produce(broker.bootstrap, topic, varied_records(100, 2, "b"), compression=codec)
    expected = read_topic(broker.bootstrap, topic, isolation_level="read_uncommitted")
    assert len(expected) == 400
    assert read_all(broker, topic, 2) == expected


def aborted_index(log: bytes) -> list[tuple[int, int]]:
    """The (producer_id, first_offset) list a Kafka broker keeps for aborted transactions,
    rebuilt from the transaction markers in the log."""
    open_since: dict[int, int] = {}
    aborted: list[tuple[int, int]] = []
    pos = 0
    while pos + 61 <= len(log):
        base_offset, length = struct.unpack_from(">qi", log, pos)
        (attributes,) = struct.unpack_from(">h", log, pos + 21)
        (producer_id,) = struct.unpack_from(">q", log, pos + 43)
        if attributes & 0x20:  # control batch: the transaction ends here
            marker = control_marker(memoryview(log)[pos + 61 : pos + 12 + length])
            first = open_since.pop(producer_id, None)
            if marker == CONTROL_ABORT and first is not None:
                aborted.append((producer_id, first))
        elif attributes & 0x10:
            open_since.setdefault(producer_id, base_offset)
        pos += 12 + length
    return aborted


def fetch_whole_log(bootstrap: str, topic: str) -> bytes:
    """Every batch of partition 0, read uncommitted with raw Fetches up to the high
    watermark. Kafka answers a Fetch from one log segment at most, and a batch whose
    timestamp is older than ``log.roll.ms`` starts a segment of its own: it takes a
    Fetch per segment."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    log = bytearray()
    offset, high_watermark = 0, None
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        for correlation_id in range(1, 1000):
            request = FetchRequest(
                max_wait_ms=50,
                min_bytes=1,
                max_bytes=16 << 20,
                isolation_level=0,
                topics=(
                    FetchTopic(
                        topic=topic,
                        partitions=(
                            FetchPartition(
                                partition=0, fetch_offset=offset, partition_max_bytes=16 << 20
                            ),
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            )
            sock.sendall(
                encode_request(
                    request, version=FETCH_VERSION, correlation_id=correlation_id, client_id="t"
                )
            )
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            _, response = decode_response(1, FETCH_VERSION, _recv_exactly(sock, size))
            assert isinstance(response, FetchResponse)
            partition = response.responses[0].partitions[0]
            assert partition.error_code == 0, partition
            high_watermark = partition.high_watermark
            chunk = bytes(partition.records or b"")
            pos = 0
            while pos + 12 <= len(chunk):  # whole batches only; the next Fetch resumes
                base_offset, length = struct.unpack_from(">qi", chunk, pos)
                if pos + 12 + length > len(chunk):
                    break
                (last_delta,) = struct.unpack_from(">i", chunk, pos + 23)
                log += chunk[pos : pos + 12 + length]
                offset = base_offset + last_delta + 1
                pos += 12 + length
            if offset >= high_watermark:
                return bytes(log)
    raise AssertionError(f"no end of {topic} after 999 Fetches (at {offset} of {high_watermark})")


def test_read_committed_matches_librdkafka_and_drops_aborted_transactions(
    broker: KafkaCluster, topic: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)

    def batch(tag: str, count: int) -> list[ProducedRecord]:
        return [
            ProducedRecord(f"{tag}-{i}".encode(), key=tag.encode(), timestamp_ms=T0 + i)
            for i in range(count)
        ]

    produce_transactions(
        broker.bootstrap,
        topic,
        [
            Transaction(batch("committed-1", 20)),
            Transaction(batch("aborted", 15), commit=False),
            Transaction(batch("committed-2", 10)),
        ],
        compression="lz4",
    )
    # Same broker answers, same result as librdkafka's read_committed consumer.
    reference = read_topic(broker.bootstrap, topic, isolation_level="read_committed")
    assert read_all(broker, topic, 1, read_committed=True) == reference
    everything = read_topic(broker.bootstrap, topic, isolation_level="read_uncommitted")
    assert len(everything) == 45
    assert read_all(broker, topic, 1) == everything

    # Rebuild the aborted-transaction list from the markers, as the broker's transaction
    # index holds it, and check the decoder then drops exactly the aborted transaction.
    log = fetch_whole_log(broker.bootstrap, topic)
    aborted = aborted_index(log)
    assert len(aborted) == 1
    decoded = decode_records(
        log, topic=topic, partition=0, read_committed=True, aborted_transactions=aborted
    )
    assert decoded.corrupt == ()
    committed = [r for r in everything if r.key != b"aborted"]
    assert [r.key for r in committed] == [b"committed-1"] * 20 + [b"committed-2"] * 10
    assert as_consumed(topic, [decoded]) == committed
