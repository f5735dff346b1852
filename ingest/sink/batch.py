"""What a landing takes and gives (``land.py``): the ``Batch`` an engine is handed, the
``WriteRequest`` its tasks write, the ``WrittenFiles`` they send back, and the
``BatchResult``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingest.handoff import CorruptRangeReported, SegmentSealed
from ingest.protocol.partition import Partition
from ingest.sink.deadletter import Rejected
from ingest.sink.files import DataFile
from ingest.sink.metadata.mapping import ColumnMapping
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import TableConfig
from ingest.sink.txn import TableCommitter

__all__ = ["Batch", "BatchResult", "WriteRequest", "WrittenFiles"]


@dataclass(frozen=True)
class Batch:
    """What one landing takes: sealed segments and corrupt ranges of one or more
    partitions, into one table. ``segment_storage_options`` are the handoff's
    pyarrow options for segments on an object store."""

    table: TableConfig
    segments: tuple[SegmentSealed, ...]
    corrupt: tuple[CorruptRangeReported, ...] = ()
    segment_storage_options: Mapping[str, Any] = field(default_factory=dict)
    # Replace the rows the tables hold in the batch's offset ranges (replay --overwrite)
    # instead of skipping the offsets they already hold.
    overwrite: bool = False
    # The engine's commit for a table delta-rs cannot write (Delta Spark's transaction).
    committer: TableCommitter | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "corrupt", tuple(self.corrupt))

    def partitions(self) -> list[Partition]:
        keys = {Partition(s.topic, s.partition) for s in self.segments}
        keys |= {Partition(c.topic, c.partition) for c in self.corrupt}
        return sorted(keys)

    def offset_ranges(self) -> dict[Partition, tuple[int, int]]:
        """The first and last offset the batch accounts for, per partition."""
        first: dict[Partition, int] = {}
        for s in self.segments:
            key = Partition(s.topic, s.partition)
            first[key] = min(first.get(key, s.from_offset), s.from_offset)
        for c in self.corrupt:
            key = Partition(c.topic, c.partition)
            first[key] = min(first.get(key, c.first_offset), c.first_offset)
        last = self.last_offsets()
        return {key: (first[key], last[key]) for key in first}

    def last_offsets(self) -> dict[Partition, int]:
        """The last offset the batch accounts for, per partition (its txn version)."""
        last: dict[Partition, int] = {}
        for s in self.segments:
            key = Partition(s.topic, s.partition)
            last[key] = max(last.get(key, -1), s.next_offset - 1)
        for c in self.corrupt:
            key = Partition(c.topic, c.partition)
            end = c.first_offset if c.last_offset is None else c.last_offset
            last[key] = max(last.get(key, -1), end)
        return last


@dataclass(frozen=True)
class BatchResult:
    """What the batch did. ``durable_offsets``: per partition, the highest offset the
    table's txn versions now cover (None: nothing of it landed yet)."""

    table_version: int | None
    dead_letter_version: int | None
    durable_offsets: Mapping[Partition, int | None]
    rows_written: int
    dead_letters: int
    stage_seconds: Mapping[str, float]
    path: str  # "arrow", "spark" or "none"
    files: int = 0
    attempts: int = 1
    replaced_rows: int = 0  # rows of the table an overwrite took out
    deleted_rows: int = 0  # rows of the table an upsert deleted (tombstones, change events)


@dataclass(frozen=True)
class WriteRequest:
    """What a writer writes in one attempt: ``segments`` (those with records above
    the table's txn version), with the offsets of each partition the table and the
    dead-letter table hold already (None: none), which it must leave out; data files
    go to ``table`` under ``prefix``, split by ``partition_by``, with the physical names
    of the table's column ``mapping`` (None: none, or staged upsert rows), dead letters to
    ``dead``. File names carry ``token``."""

    token: str
    segments: tuple[SegmentSealed, ...]
    skip_through: Mapping[Partition, int | None]
    dead_skip_through: Mapping[Partition, int | None]
    table: TableLocation
    dead: TableLocation
    partition_by: tuple[str, ...]
    prefix: str
    segment_options: Mapping[str, Any]
    ingest_time: dt.datetime
    mapping: ColumnMapping | None = None


@dataclass(frozen=True)
class WrittenFiles:
    """What a writer wrote: data files, dead-letter files, the rows a transform
    rejected (the driver builds their dead letters), the rows' schema, and the path
    they took ("arrow", "spark", or "none" when no task ran)."""

    data: tuple[DataFile, ...]
    dead: tuple[DataFile, ...]
    rejected: tuple[Rejected, ...]
    schema: pa.Schema
    path: str
