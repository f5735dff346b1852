"""The confluent-kafka peer path shared by the benchmarks: what a user would write to turn
librdkafka's messages into the same Arrow columns our decoder produces."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ingest.protocol.records import RECORD_SCHEMA


def confluent_to_arrow(consumer: Any, topic: str, count: int) -> pa.RecordBatch:
    """Consumes ``count`` messages from an assigned consumer into one RECORD_SCHEMA batch."""
    offsets: list[int] = []
    partitions: list[int] = []
    timestamps: list[int] = []
    types: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[dict[str, Any]]] = []
    while len(offsets) < count:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error():
                raise RuntimeError(msg.error())
            kind, stamp = msg.timestamp()
            offsets.append(msg.offset())
            partitions.append(msg.partition())
            timestamps.append(stamp)
            types.append(kind - 1)  # librdkafka counts from 1, Kafka from 0
            keys.append(msg.key())
            values.append(msg.value())
            headers.append([{"key": k, "value": v} for k, v in msg.headers() or ()])
    rows = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([topic])),
            pa.array(partitions, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps, pa.int64()).cast(RECORD_SCHEMA.field("timestamp").type),
            pa.array(types, pa.int8()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )
