"""Helpers for sink tests: real segments from the real broker, tables read back two ways."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from deltalake import DeltaTable

from ingest.handoff import HandoffStore, SegmentSealed
from ingest.testing import ConsumedRecord, KafkaCluster, ProducedRecord
from ingest.worker import EndPosition, WorkerFinished
from tests.worker.support import WatchedHandle, sealed, worker_settings

USERS = 40
# Every MALFORMED_EVERY-th value is not a valid record of JSON_SCHEMA.
MALFORMED_EVERY = 53
JSON_SCHEMA = "id BIGINT, user STRING, amount DOUBLE, tags ARRAY<STRING>"
MALFORMED = (
    b'{"id": 1, "user": ',  # cut short
    b"not json at all",
    b'{"id": "seven", "user": "u"}',  # wrong type
    b'[{"id": 1}]',  # not an object
    b"",
)


def json_value(i: int) -> bytes:
    if i % MALFORMED_EVERY == MALFORMED_EVERY - 1:
        return MALFORMED[(i // MALFORMED_EVERY) % len(MALFORMED)]
    document: dict[str, Any] = {"id": i, "user": f"u{i % USERS}", "amount": i * 0.5}
    if i % 3 == 0:
        document["tags"] = ["a", f"t{i % 5}"]
    if i % 11 == 0:
        # Pretty-printed: newlines inside a value take the per-record path.
        return orjson.dumps(document, option=orjson.OPT_INDENT_2)
    return orjson.dumps(document)


def is_malformed(value: bytes | None) -> bool:
    return value in MALFORMED


def json_records(count: int) -> Iterator[ProducedRecord]:
    """Keyed by user (so a user stays in one partition), some headers."""
    for i in range(count):
        yield ProducedRecord(
            json_value(i),
            key=b"u%d" % (i % USERS),
            headers=[("n", b"%d" % i), ("empty", None)] if i % 7 == 0 else None,
        )


@dataclass(frozen=True)
class Drained:
    """A topic produced through the broker, its reference reading, its segments."""

    topic: str
    reference: tuple[ConsumedRecord, ...]
    segments: tuple[SegmentSealed, ...]
    store: HandoffStore

    def of_partition(self, partition: int) -> list[SegmentSealed]:
        return [s for s in self.segments if s.partition == partition]


def drain(
    broker: KafkaCluster, store: HandoffStore, topic: str, partitions: int
) -> list[SegmentSealed]:
    """Runs one worker per partition (concurrently) to the end of the partition."""
    handles = [
        WatchedHandle.spawn(
            worker_settings(broker.bootstrap, store, topic, partition=p, end=EndPosition.latest()),
            store=store,
        )
        for p in range(partitions)
    ]
    segments: list[SegmentSealed] = []
    try:
        for handle in handles:
            events: list[Any] = []
            handle.wait_for(WorkerFinished, timeout=60, collect=events)
            assert handle.join(10) == 0, handle.exit_reason()
            segments.extend(sealed(events))
    finally:
        for handle in handles:
            handle.close()
    return sorted(segments, key=lambda s: (s.partition, s.first_offset))


# -- reading tables back ---------------------------------------------------------------------


def delta_rows(uri: str, storage_options: dict[str, str] | None = None) -> pa.Table:
    table = DeltaTable(uri, storage_options=storage_options).to_pyarrow_table()
    return table.sort_by([("partition", "ascending"), ("offset", "ascending")])


def spark_rows(spark: Any, uri: str) -> pa.Table:
    """The table read by Spark as plain Parquet (no Delta jars): delta-rs lists the
    live files, Spark reads them with the table's schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    table = DeltaTable(uri)
    schema = table.schema().to_arrow()
    partitions = table.metadata().partition_columns
    data_schema = pa.schema([f for f in pa.schema(schema) if f.name not in partitions])
    reader = spark.read.schema(from_arrow_schema(data_schema, prefer_timestamp_ntz=False))
    if partitions:
        reader = reader.option("basePath", uri)
    frame = reader.parquet(*table.file_uris())
    return frame.toArrow().sort_by([("partition", "ascending"), ("offset", "ascending")])


def expected_columns(records: Sequence[ConsumedRecord]) -> dict[str, list[Any]]:
    return {
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "timestamp": [dt.datetime.fromtimestamp(r.timestamp_ms / 1000, dt.UTC) for r in records],
        "timestamp_type": [r.timestamp_type for r in records],
        "key": [r.key for r in records],
        "headers": [[{"key": k, "value": v} for k, v in r.headers] for r in records],
    }


def assert_rows_equal_reference(
    table: pa.Table, records: Sequence[ConsumedRecord], *, with_value: bool = True
) -> None:
    """Every Kafka column equals the reference reader's, row by row (dead-letter
    rows carry no timestamp type)."""
    assert table.num_rows == len(records), (table.num_rows, len(records))
    expected = expected_columns(records)
    if "error_stage" in table.column_names:
        del expected["timestamp_type"]
    if with_value:
        expected["value"] = [r.value for r in records]
    for name, values in expected.items():
        got = table.column(name).to_pylist()
        if name == "timestamp":
            got = [v.astimezone(dt.UTC) for v in got]
        mismatches = [i for i, (a, b) in enumerate(zip(got, values, strict=True)) if a != b]
        assert not mismatches, f"{name} differs at rows {mismatches[:5]}: {got[mismatches[0]]!r}"
