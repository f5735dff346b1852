"""Data files rewritten without some of their rows.

Two callers, one mechanism (read the file, mask the rows by (topic, partition,
offset), write the rest next to it as a new data file with its footer):

* ``cut_ranges``, the overwrite (``ingest replay --overwrite``,
  ``DeltaTarget.commit_replacing``): every row the table's current snapshot
  holds in the batch's offset ranges is taken out. Files wholly inside a range
  are removed; files that mix rows inside and outside are removed and rewritten
  without the inside rows. Files whose statistics rule the ranges out are not
  read.
* ``without_covered``, the re-filter after a lost race
  (``DeltaTarget.commit_files``): a file of this batch without the rows a
  concurrent writer's txn versions now cover.

A rewritten file is named ``r<attempt>-<random>-<name>`` in its original's
directory, so the files of an attempt that lost its race can be told apart and
deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from ingest.protocol.partition import Partition
from ingest.sink.files import FOOTER_KEY, DataFile, sources_of, write_data_file
from ingest.sink.storage import TableLocation

__all__ = ["cut_ranges", "in_ranges", "partition_text", "without_covered"]

_INT64_MIN = -(2**63)


def cut_ranges(
    location: TableLocation,
    table: DeltaTable,
    ranges: Mapping[Partition, tuple[int, int]],
    attempt: int,
) -> tuple[list[RemoveAction], list[DataFile], int]:
    """The remove actions, rewritten files and replaced row count that take every
    row in ``ranges`` ((topic, partition) -> inclusive first and last offset) out of
    ``table``'s current snapshot."""
    if not ranges:
        return [], [], 0
    listing = pa.table(table.get_add_actions(flatten=True))
    removes: list[RemoveAction] = []
    rewritten: list[DataFile] = []
    replaced = 0
    removed_at = int(time.time() * 1000)
    partition_columns = [c for c in listing.column_names if c.startswith("partition.")]
    opened = location.filesystem()
    for entry in listing.to_pylist():
        if not _may_hold(entry, ranges):
            continue
        rows = _read(opened, entry["path"])
        inside = in_ranges(rows, ranges)
        hits = pc.sum(inside).as_py() or 0
        if not hits:
            continue
        replaced += hits
        described = _footer(rows.schema)
        partition_values = (
            described.partition_values
            if described is not None
            else tuple(
                (column.removeprefix("partition."), partition_text(entry[column]))
                for column in partition_columns
            )
        )
        removes.append(
            RemoveAction(
                entry["path"],
                True,
                removed_at,
                size=int(entry["size_bytes"]),
                partition_values=dict(partition_values) or None,
            )
        )
        if hits < rows.num_rows:
            remaining = rows.filter(pc.invert(inside))
            rewritten.append(
                _write_remainder(
                    location, opened, entry["path"], partition_values, remaining, attempt
                )
            )
    return removes, rewritten, replaced


def without_covered(
    location: TableLocation, data_file: DataFile, cut: Mapping[Partition, int], attempt: int
) -> DataFile | None:
    """``data_file`` rewritten without its rows at or below ``cut``'s offsets (None when
    none is left). The original stays: the caller deletes it."""
    if all(
        Partition(s.topic, s.partition) in cut
        and s.max_offset <= cut[Partition(s.topic, s.partition)]
        for s in data_file.sources
    ):
        return None
    opened = location.filesystem()
    rows = _read(opened, data_file.path)
    covered = in_ranges(rows, {key: (_INT64_MIN, version) for key, version in cut.items()})
    remaining = rows.filter(pc.invert(covered))
    if remaining.num_rows == 0:
        return None
    return _write_remainder(
        location, opened, data_file.path, data_file.partition_values, remaining, attempt
    )


def in_ranges(rows: pa.Table, ranges: Mapping[Partition, tuple[int, int]]) -> Any:
    """A mask of the rows whose (topic, partition, offset) falls in ``ranges``
    ((topic, partition) -> inclusive first and last offset)."""
    topic, partition, offset = rows.column("topic"), rows.column("partition"), rows.column("offset")
    inside: Any = None
    for (name, index), (first, last) in ranges.items():
        hit = pc.and_(
            pc.and_(pc.equal(topic, name), pc.equal(partition, index)),
            pc.and_(pc.greater_equal(offset, first), pc.less_equal(offset, last)),
        )
        hit = pc.fill_null(hit, False)
        inside = hit if inside is None else pc.or_(inside, hit)
    return inside if inside is not None else pa.array(np.zeros(rows.num_rows, bool))


def _read(opened: tuple[pafs.FileSystem, str], path: str) -> pa.Table:
    filesystem, root = opened
    with filesystem.open_input_file(f"{root}/{path}") as handle:
        return pq.read_table(handle)


def _write_remainder(
    location: TableLocation,
    opened: tuple[pafs.FileSystem, str],
    path: str,
    partition_values: tuple[tuple[str, str | None], ...],
    remaining: pa.Table,
    attempt: int,
) -> DataFile:
    """``remaining`` written next to ``path`` as a new data file (with its footer)."""
    directory, _, name = path.rpartition("/")
    prefix = f"r{attempt}-{uuid.uuid4().hex[:8]}"
    relative = f"{directory}/{prefix}-{name}" if directory else f"{prefix}-{name}"
    return write_data_file(
        location,
        relative,
        remaining,
        partition_values=partition_values,
        sources=sources_of(remaining),
        opened=opened,
    )


def _may_hold(entry: Mapping[str, object], ranges: Mapping[Partition, tuple[int, int]]) -> bool:
    """Whether a file's statistics allow rows in ``ranges`` (no statistics: maybe)."""
    low_topic, high_topic = entry.get("min.topic"), entry.get("max.topic")
    low_part, high_part = entry.get("min.partition"), entry.get("max.partition")
    low_offset, high_offset = entry.get("min.offset"), entry.get("max.offset")
    for (topic, partition), (first, last) in ranges.items():
        topic_out = (
            isinstance(low_topic, str)
            and isinstance(high_topic, str)
            and not low_topic <= topic <= high_topic
        )
        partition_out = (
            isinstance(low_part, int)
            and isinstance(high_part, int)
            and not low_part <= partition <= high_part
        )
        offsets_out = (
            isinstance(low_offset, int)
            and isinstance(high_offset, int)
            and (high_offset < first or low_offset > last)
        )
        if topic_out or partition_out or offsets_out:
            continue
        return True
    return False


def _footer(schema: pa.Schema) -> DataFile | None:
    """How ingest described a data file it wrote (None for another writer's file)."""
    raw = (schema.metadata or {}).get(FOOTER_KEY)
    return None if raw is None else DataFile.from_json(raw)


def partition_text(value: object) -> str | None:
    """A partition value as the Delta log writes it (strings; None for null)."""
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)
