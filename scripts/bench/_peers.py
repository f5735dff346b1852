"""The confluent-kafka peers of the benchmarks: what a user would write to turn librdkafka's
messages into the same Arrow columns our decoder produces (decode.py, consume.py), and the
naive and read + write pipelines of the end-to-end benchmark (e2e.py)."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from ingest.protocol.recordbatch.records import RECORD_SCHEMA


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


# -- end-to-end peers (scripts/bench/e2e.py) ----------------------------------------------------


def _kafka_timestamps(millis: list[int]) -> pa.Array:
    return (
        pa.array(millis, pa.int64())
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC"))
    )


def naive_pipeline(
    bootstrap: str,
    topic: str,
    group: str,
    table: str,
    ends: dict[int, int],
    schema: pa.Schema,
    value_fields: list[str],
    batch_rows: int = 100_000,
) -> dict[str, float]:
    """What a user would write: a confluent-kafka group consumer, orjson per value into
    column lists, a pyarrow table per ``batch_rows`` messages, a ``write_deltalake``
    append, then a synchronous offset commit. Stops once every partition reached its
    end (given: Tansu's ListOffsets "latest" is wrong). Returns phase seconds."""
    import orjson
    from confluent_kafka import Consumer
    from deltalake import write_deltalake

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # Tansu holds a JoinGroup for session/2; the default 45 s would cost 22 s.
            "session.timeout.ms": 6000,
            # Its default throttles a fast consumer to a fifth (docs/kafka-compat.md).
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.subscribe([topic])
    spent = {"parse": 0.0, "arrow": 0.0, "write": 0.0, "commit": 0.0}
    lists: dict[str, list[Any]] = {}

    def reset() -> None:
        for name in ("partition", "offset", "timestamp", "type", "key", *value_fields):
            lists[name] = []

    def flush() -> None:
        rows = len(lists["offset"])
        if not rows:
            return
        began = time.perf_counter()
        arrays = [
            pa.array([topic] * rows, pa.string()),
            pa.array(lists["partition"], pa.int32()),
            pa.array(lists["offset"], pa.int64()),
            _kafka_timestamps(lists["timestamp"]),
            pa.array(lists["type"], pa.int8()),
            pa.array(lists["key"], pa.binary()),
            pa.array([[]] * rows, schema.field("headers").type),
            *(pa.array(lists[name], schema.field(name).type) for name in value_fields),
        ]
        batch = pa.Table.from_arrays(arrays, schema=schema)
        arrow_done = time.perf_counter()
        write_deltalake(table, batch, mode="append")
        written = time.perf_counter()
        consumer.commit(asynchronous=False)
        spent["arrow"] += arrow_done - began
        spent["write"] += written - arrow_done
        spent["commit"] += time.perf_counter() - written
        reset()

    reset()
    positions = dict.fromkeys(ends, 0)
    first_message: float | None = None
    began = time.perf_counter()
    try:
        while any(positions[p] < end for p, end in ends.items()):
            messages = consumer.consume(10_000, 1.0)
            parsing = time.perf_counter()
            if messages and first_message is None:
                first_message = parsing - began
            for msg in messages:
                if msg.error():
                    raise RuntimeError(msg.error())
                record = orjson.loads(msg.value())
                lists["partition"].append(msg.partition())
                lists["offset"].append(msg.offset())
                kind, stamp = msg.timestamp()
                lists["timestamp"].append(stamp)
                lists["type"].append(kind - 1)  # librdkafka counts from 1, Kafka from 0
                lists["key"].append(msg.key())
                for name in value_fields:
                    lists[name].append(record.get(name))
                positions[msg.partition()] = msg.offset() + 1
                if len(lists["offset"]) >= batch_rows:
                    spent["parse"] += time.perf_counter() - parsing
                    flush()
                    parsing = time.perf_counter()
            spent["parse"] += time.perf_counter() - parsing
        flush()
    finally:
        consumer.close()
    spent["join_and_first_fetch"] = first_message or 0.0
    return spent


def read_write_pipeline(
    bootstrap: str, topic: str, table: str, ends: dict[int, int], spec: Any
) -> dict[str, float]:
    """librdkafka's raw consumer reads every message (counted, nothing built), then one
    ``write_deltalake`` of the same rows as Arrow. The Arrow data is built between the two
    from a second read (not timed): ``read + write`` is its figure (one way of reading and
    writing, not a floor: that is ``_floor.py``)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from deltalake import write_deltalake

    from ingest.formats.decode import decode, spark_records

    def consumer() -> Any:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{topic}-read-write",
                "enable.auto.commit": False,
                "fetch.queue.backoff.ms": 10,
            }
        )
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        return c

    total = sum(ends.values())
    raw = consumer()
    try:
        began = time.perf_counter()
        seen = 0
        while seen < total:
            messages = raw.consume(10_000, 1.0)
            for msg in messages:
                if msg.error():
                    raise RuntimeError(msg.error())
            seen += len(messages)
        read = time.perf_counter() - began
    finally:
        raw.close()

    began = time.perf_counter()
    builder = consumer()
    chunks: list[pa.Table] = []
    try:
        built = 0
        while built < total:
            batch = confluent_to_arrow(builder, topic, min(100_000, total - built))
            built += batch.num_rows
            decoded = decode(spark_records(pa.Table.from_batches([batch])), spec)
            if decoded.dead.num_rows:
                raise RuntimeError(f"{decoded.dead.num_rows} values did not decode")
            chunks.append(decoded.rows)
    finally:
        builder.close()
    data = pa.concat_tables(chunks)
    prepare = time.perf_counter() - began

    began = time.perf_counter()
    write_deltalake(table, data, mode="append")
    write = time.perf_counter() - began
    return {"read": read, "write": write, "prepare_untimed": prepare}
