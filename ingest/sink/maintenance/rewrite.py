"""Data files rewritten without some of their rows.

Two callers, one mechanism (read the file, mask the rows by (topic, partition,
offset), write the rest next to it as a new data file with its footer):

* ``cut_ranges``, the overwrite (``ingest replay --overwrite``,
  ``overwrite.commit_replacing``): every row the table's current snapshot
  holds in the batch's offset ranges is taken out. Files wholly inside a range
  are removed; files that mix rows inside and outside are removed and rewritten
  without the inside rows. Files whose statistics rule the ranges out are not
  read.
* ``refilter``, after a lost race (``DeltaTarget.commit_files``): a batch's files
  without the rows a concurrent writer's txn versions now cover (``without_covered``
  rewrites one). A file that does not say which offsets it holds raises
  ``StaleBatchError``: the batch is redone from its segments.

A rewritten file is named ``r<attempt>-<random>-<name>`` in its original's
directory, so the files of an attempt that lost its race can be told apart and
deleted.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from ingest.errors import SinkError
from ingest.protocol.partition import Partition
from ingest.sink.files import FOOTER_KEY, DataFile, sources_of, write_data_file
from ingest.sink.metadata.evolution import mapping_of
from ingest.sink.metadata.features import rows_through_delta_spark
from ingest.sink.metadata.mapping import ColumnMapping, covering, logical, physical_name
from ingest.sink.storage import TableLocation
from ingest.sink.txn import advances

__all__ = [
    "StaleBatchError",
    "cut_ranges",
    "in_ranges",
    "partition_text",
    "plain_type",
    "read_data_file",
    "refilter",
    "without_covered",
    "without_views",
    "write_remainder",
]

log = logging.getLogger("ingest.sink")

_INT64_MIN = -(2**63)
# The prefix ``write_remainder`` gives a rewritten file's name (any number of them).
_REWRITTEN = re.compile(r"^(r[0-9]+-[0-9a-f]{8}-)+")


def cut_ranges(
    location: TableLocation,
    table: DeltaTable,
    ranges: Mapping[Partition, tuple[int, int]],
    attempt: int,
    mapping: ColumnMapping | None = None,
) -> tuple[list[RemoveAction], list[DataFile], int]:
    """The remove actions, rewritten files and replaced row count that take every
    row in ``ranges`` ((topic, partition) -> inclusive first and last offset) out of
    ``table``'s current snapshot (``mapping``: its column mapping)."""
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
        rows = read_data_file(opened, entry["path"])
        logical_values = {c.removeprefix("partition."): entry[c] for c in partition_columns}
        inside = in_ranges(_keys(rows, logical_values, mapping), ranges)
        hits = pc.sum(inside).as_py() or 0
        if not hits:
            continue
        replaced += hits
        described = _footer(rows.schema)
        partition_values = (
            described.partition_values
            if described is not None
            else tuple(
                (
                    physical_name(mapping, column.removeprefix("partition.")),
                    partition_text(entry[column]),
                )
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
                write_remainder(
                    location, opened, entry["path"], partition_values, remaining, attempt, mapping
                )
            )
    return removes, rewritten, replaced


class StaleBatchError(SinkError):
    """A concurrent writer covered offsets of this batch and its files cannot be
    re-filtered in place, or the table's column mapping changed since its files were
    written: the caller must redo the batch from its segments."""


def check_written(
    uri: str,
    table: DeltaTable,
    files: Sequence[DataFile],
    schema: pa.Schema,
    written: ColumnMapping | None,
    *,
    appending: bool = False,
) -> None:
    """Raises ``StaleBatchError`` when ``files`` (of ``schema``'s columns) no longer fit
    ``table``: written with another column mapping than the table's now, or (``appending``)
    the table now wants its appended rows checked or completed by Delta Spark's writer
    (a constraint, generated or identity column added since the batch was planned)."""
    if not files:
        return
    if covering(mapping_of(table), schema.names) != covering(written, schema.names):
        raise StaleBatchError(
            f"{uri}: the table's column mapping changed since the batch's files "
            "were written (a column added, renamed or mapped): writing them again"
        )
    if appending and rows_through_delta_spark(table):
        raise StaleBatchError(
            f"{uri}: the table's rows must now be checked or completed by Delta Spark "
            f"({', '.join(rows_through_delta_spark(table))}): writing them again"
        )


def refilter(
    location: TableLocation,
    files: list[DataFile],
    planned: Mapping[str, int | None],
    current: Mapping[str, int | None],
    app_id_of: Callable[[str, int], str],
    attempt: int,
    mapping: ColumnMapping | None,
) -> tuple[list[DataFile], int]:
    """A batch's ``files`` (written with ``mapping``, filtered with the txn versions
    ``planned``) without the rows the table's txn versions now cover (``current``, by
    app id): kept, rewritten (``without_covered``; the original deleted) or dropped; and
    how many rows went. A file that does not say which offsets it holds cannot be
    re-filtered: ``StaleBatchError``."""
    moved = {
        app
        for app, version in current.items()
        if version is not None and advances(version, planned.get(app))
    }
    if not moved or not files:
        return files, 0
    kept: list[DataFile] = []
    dropped = 0
    for data_file in files:
        if not data_file.sources:
            raise StaleBatchError(
                f"{location.uri}: a concurrent writer covered offsets of this batch and "
                f"{data_file.path} does not say which offsets it holds"
            )
        cut: dict[Partition, int] = {}
        for source in data_file.sources:
            app = app_id_of(source.topic, source.partition)
            version = current.get(app)
            if app in moved and version is not None and source.min_offset <= version:
                cut[Partition(source.topic, source.partition)] = version
        if not cut:
            kept.append(data_file)
            continue
        rewritten = without_covered(location, data_file, cut, attempt, mapping)
        location.delete([data_file.path])
        dropped += data_file.rows - (rewritten.rows if rewritten else 0)
        if rewritten is not None:
            kept.append(rewritten)
    log.info("%s: re-filtered after a concurrent commit; %d rows dropped", location.uri, dropped)
    return kept, dropped


def without_covered(
    location: TableLocation,
    data_file: DataFile,
    cut: Mapping[Partition, int],
    attempt: int,
    mapping: ColumnMapping | None = None,
) -> DataFile | None:
    """``data_file`` (written with ``mapping``) rewritten without its rows at or below
    ``cut``'s offsets (None when none is left). The original stays: the caller deletes it."""
    if all(
        Partition(s.topic, s.partition) in cut
        and s.max_offset <= cut[Partition(s.topic, s.partition)]
        for s in data_file.sources
    ):
        return None
    opened = location.filesystem()
    rows = read_data_file(opened, data_file.path)
    logical_values = {
        name if mapping is None else mapping.logical_name(name): value
        for name, value in data_file.partition_values
    }
    covered = in_ranges(
        _keys(rows, logical_values, mapping),
        {key: (_INT64_MIN, version) for key, version in cut.items()},
    )
    remaining = rows.filter(pc.invert(covered))
    if remaining.num_rows == 0:
        return None
    return write_remainder(
        location, opened, data_file.path, data_file.partition_values, remaining, attempt, mapping
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


_KEYS = {"topic": pa.string(), "partition": pa.int32(), "offset": pa.int64()}


def _keys(
    rows: pa.Table, partition_values: Mapping[str, object], mapping: ColumnMapping | None
) -> pa.Table:
    """A data file's rows by logical names, with its topic, partition and offset columns:
    a partition column is not in the file, its value is the file's (``partition_values``,
    by logical name)."""
    keyed = logical(mapping, rows)
    for name, kind in _KEYS.items():
        if name not in keyed.column_names and name in partition_values:
            column = pa.repeat(pa.scalar(partition_values[name]), rows.num_rows).cast(kind)
            keyed = keyed.append_column(name, column)
    return keyed


def read_data_file(
    opened: tuple[pafs.FileSystem, str], path: str, columns: Sequence[str] = ()
) -> pa.Table:
    """A data file (``columns``: only those of them it has), views read as plain types."""
    filesystem, root = opened
    with filesystem.open_input_file(f"{root}/{path}") as handle:
        parquet = pq.ParquetFile(handle)
        if not columns:
            return without_views(parquet.read())
        present = set(parquet.schema_arrow.names)
        return without_views(parquet.read(columns=[c for c in columns if c in present]))


def without_views(table: pa.Table) -> pa.Table:
    """``table`` with string and binary views as plain strings and binaries: files delta-rs
    1.6 writes read back with views, which pyarrow's filter and take do not take (measured:
    "array_take has no kernel matching input types (string_view, ...)")."""
    fields = [field.with_type(plain_type(field.type)) for field in table.schema]
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def plain_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with Arrow's view types replaced by the plain ones, nested types too."""
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_struct(kind):
        return pa.struct(
            [
                kind.field(i).with_type(plain_type(kind.field(i).type))
                for i in range(kind.num_fields)
            ]
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        item = kind.value_field.with_type(plain_type(kind.value_field.type))
        return pa.large_list(item) if pa.types.is_large_list(kind) else pa.list_(item)
    if pa.types.is_map(kind):
        return pa.map_(
            kind.key_field.with_type(plain_type(kind.key_field.type)),
            kind.item_field.with_type(plain_type(kind.item_field.type)),
        )
    return kind


def write_remainder(
    location: TableLocation,
    opened: tuple[pafs.FileSystem, str],
    path: str,
    partition_values: tuple[tuple[str, str | None], ...],
    remaining: pa.Table,
    attempt: int,
    mapping: ColumnMapping | None,
) -> DataFile:
    """``remaining`` (physical columns) written next to ``path`` as a new data file
    (with its footer), named after the original without the prefixes earlier rewrites
    gave it (a file rewritten again and again keeps a name of the same length)."""
    directory, _, name = path.rpartition("/")
    name = _REWRITTEN.sub("", name)
    prefix = f"r{attempt}-{uuid.uuid4().hex[:8]}"
    relative = f"{directory}/{prefix}-{name}" if directory else f"{prefix}-{name}"
    return write_data_file(
        location,
        relative,
        remaining,
        partition_values=partition_values,
        sources=sources_of(logical(mapping, remaining)),
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
