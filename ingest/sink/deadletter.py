"""The dead-letter table: records that could not land, with their provenance.

One row per bad record (or per corrupt batch): the Kafka coordinates, the raw
key, value and headers, the stage that refused it (``decode``: the value does
not parse as configured; ``transform``: the SQL transform marked the row in
``_dead_letter``; ``corrupt batch``: the record batch itself failed its checks,
``value`` then holds the batch's raw bytes and ``offset`` its first offset),
the error and when ingest wrote it. The table is unpartitioned.

Dead letters found by the tasks (decode failures) are written there; those found
on the driver are built here: corrupt batches from their raw bytes
(``corrupt_dead_letters``, ``read_corrupt_raw``), and rows refused after decoding
(by the transform, or for a null merge key) from their raw records read back from
the segments (``rejected_dead_letters``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ingest.handoff import CorruptRangeReported, SegmentSealed, read_segment
from ingest.protocol.partition import Partition
from ingest.sink.txn import or_minus_one

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "HEADERS_TYPE",
    "STAGE_CORRUPT",
    "STAGE_DECODE",
    "STAGE_TRANSFORM",
    "Rejected",
    "corrupt_dead_letters",
    "dead_letters",
    "read_corrupt_raw",
    "rejected_dead_letters",
]

STAGE_DECODE = "decode"
STAGE_TRANSFORM = "transform"
STAGE_CORRUPT = "corrupt batch"

# Headers as Spark and Delta see them: array<struct<key string, value binary>>.
HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_TIMESTAMP = pa.timestamp("us", tz="UTC")

# A row refused after decoding: topic, partition, offset, why.
Rejected = tuple[str, int, int, str]

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TIMESTAMP),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("error_stage", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("ingest_time", _TIMESTAMP),
    ]
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def dead_letters(
    records: pa.Table,
    stage: str,
    messages: Sequence[str] | pa.Array,
    *,
    ingest_time: dt.datetime | None = None,
) -> pa.Table:
    """Dead-letter rows for ``records`` (Kafka columns, raw binary ``value``)."""
    count = records.num_rows
    if len(messages) != count:
        raise ValueError(f"{len(messages)} messages for {count} records")
    if not count:
        # Every batch asks for its (mostly empty) decode dead letters. pa.array() of a
        # list and Schema.empty_table() import pandas: 0.25-0.7 s of a local-engine task
        # process's first task.
        return pa.Table.from_batches([], schema=DEAD_LETTER_SCHEMA)
    moment = ingest_time or _now()

    def column(name: str, kind: pa.DataType) -> pa.Array | pa.ChunkedArray:
        if name in records.column_names:
            return records.column(name).cast(kind)
        return pa.nulls(count, kind)

    arrays = [
        column("topic", pa.string()),
        column("partition", pa.int32()),
        column("offset", pa.int64()),
        column("timestamp", _TIMESTAMP),
        column("key", pa.binary()),
        column("value", pa.binary()),
        column("headers", HEADERS_TYPE),
        pa.array([stage] * count, pa.string()),
        pa.array(messages, pa.string()),
        pa.array([moment] * count, _TIMESTAMP),
    ]
    return pa.Table.from_arrays(arrays, schema=DEAD_LETTER_SCHEMA)


def corrupt_dead_letters(
    reports: Sequence[tuple[CorruptRangeReported, bytes]],
    *,
    ingest_time: dt.datetime | None = None,
) -> pa.Table:
    """One row per corrupt batch: its raw bytes as the value, its first offset."""
    moment = ingest_time or _now()
    rows = {name: [] for name in DEAD_LETTER_SCHEMA.names}  # type: ignore[var-annotated]
    for report, raw in reports:
        last = "?" if report.last_offset is None else str(report.last_offset)
        rows["topic"].append(report.topic)
        rows["partition"].append(report.partition)
        rows["offset"].append(report.first_offset)
        rows["timestamp"].append(None)
        rows["key"].append(None)
        rows["value"].append(raw)
        rows["headers"].append([])
        rows["error_stage"].append(STAGE_CORRUPT)
        rows["error_message"].append(
            f"{report.kind}: {report.reason} (offsets {report.first_offset}-{last})"
        )
        rows["ingest_time"].append(moment)
    return pa.table(rows, schema=DEAD_LETTER_SCHEMA)


def read_corrupt_raw(uri: str, options: Mapping[str, Any]) -> bytes:
    """The raw bytes of a corrupt batch, from the side file its report names."""
    if "://" not in uri or uri.startswith("file://"):
        with open(uri.removeprefix("file://"), "rb") as raw:
            return raw.read()
    scheme, _, rest = uri.partition("://")
    filesystem = (
        pafs.S3FileSystem(**options) if scheme == "s3" else pafs.FileSystem.from_uri(uri)[0]
    )
    with filesystem.open_input_stream(rest if scheme == "s3" else uri) as stream:
        return bytes(stream.read())


def rejected_dead_letters(
    segments: Sequence[SegmentSealed],
    rejected: Sequence[Rejected],
    stage: str,
    *,
    skip_through: Mapping[Partition, int | None],
    storage_options: Mapping[str, Any],
    ingest_time: dt.datetime,
) -> pa.Table:
    """Dead letters of rows refused after decoding, with their raw records read back
    from ``segments``: the rows themselves may no longer hold the raw value, key and
    headers. Rows at or below their partition's ``skip_through`` (the dead-letter
    table's txn version) are there already."""
    wanted: dict[Partition, dict[int, str]] = {}
    for topic, partition, offset, message in rejected:
        key = Partition(topic, partition)
        if offset > or_minus_one(skip_through[key]):
            wanted.setdefault(key, {})[offset] = message
    pieces: list[pa.Table] = []
    for segment in segments:
        offsets = wanted.get(Partition(segment.topic, segment.partition))
        if not offsets or not any(
            segment.first_offset <= o <= segment.last_offset for o in offsets
        ):
            continue
        expect = (segment.bytes, segment.checksum)
        records = read_segment(segment.uri, storage_options=storage_options, expect=expect)
        chosen = records.filter(
            pc.is_in(records.column("offset"), pa.array(list(offsets), pa.int64()))
        )
        messages = [offsets[o] for o in chosen.column("offset").to_pylist()]
        pieces.append(dead_letters(chosen, stage, messages, ingest_time=ingest_time))
    if not pieces:
        return DEAD_LETTER_SCHEMA.empty_table()
    return pa.concat_tables(pieces)
