"""Parquet data files written outside delta-rs, and the facts needed to commit them.

Spark tasks (and the driver, for dead letters) write Arrow tables as Parquet
with pyarrow straight into a table's location: Hive-style directories for the
partition columns (``col=<percent-encoded value>``, null as
``__HIVE_DEFAULT_PARTITION__``, as delta-rs names them), partition columns left
out of the files (Delta keeps them in the log). Each file is described by a
``DataFile``: its path relative to the table root, size, partition values,
Delta statistics and its ``sources`` (which Kafka partition and offsets it
holds), so a commit can re-filter it after losing a race. The same description
is stored in the file's footer (key ``ingest.datafile``), so a file found on
storage can be committed without other bookkeeping.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from ingest.errors import SinkError
from ingest.sink.metadata.mapping import ColumnMapping
from ingest.sink.storage import TableLocation

__all__ = [
    "FOOTER_KEY",
    "ROW_GROUP_ROWS",
    "DataFile",
    "DataFileWriter",
    "Source",
    "StatsFold",
    "delta_stats",
    "parquet_options",
    "read_data_file_footer",
    "sources_of",
    "write_data_file",
    "write_data_files",
]

FOOTER_KEY = b"ingest.datafile"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True, order=True)
class Source:
    """The rows of one Kafka partition inside one data file."""

    topic: str
    partition: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file ready to be added to a Delta table."""

    path: str  # relative to the table root, as on storage
    size: int
    partition_values: tuple[tuple[str, str | None], ...]
    rows: int
    stats: str
    sources: tuple[Source, ...]
    modification_time: int

    def add_action(self) -> AddAction:
        return AddAction(
            self.path,
            self.size,
            dict(self.partition_values),
            self.modification_time,
            True,
            self.stats,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "partition_values": [list(pair) for pair in self.partition_values],
                "rows": self.rows,
                "stats": self.stats,
                "sources": [
                    [s.topic, s.partition, s.min_offset, s.max_offset] for s in self.sources
                ],
                "modification_time": self.modification_time,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> DataFile:
        data = json.loads(text)
        return cls(
            path=data["path"],
            size=int(data["size"]),
            partition_values=tuple((k, v) for k, v in data["partition_values"]),
            rows=int(data["rows"]),
            stats=data["stats"],
            sources=tuple(Source(t, int(p), int(lo), int(hi)) for t, p, lo, hi in data["sources"]),
            modification_time=int(data["modification_time"]),
        )


# -- statistics ---------------------------------------------------------------------------


def _iso_millis(micros: int, *, round_up: bool) -> str:
    millis = micros // 1000 + (1 if round_up and micros % 1000 else 0)
    moment = _EPOCH + dt.timedelta(milliseconds=millis)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _extremes(column: pa.ChunkedArray) -> tuple[Any, Any] | None:
    """A column's min and max as comparable Python values (integers; dates; a timestamp's
    raw count in its unit), or None where the statistics keep none."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_date32(kind) or pa.types.is_timestamp(kind)):
        return None
    if column.null_count == len(column):
        return None
    extremes = pc.min_max(column)
    low, high = extremes["min"], extremes["max"]
    if pa.types.is_timestamp(kind):
        return low.cast(pa.int64()).as_py(), high.cast(pa.int64()).as_py()
    return low.as_py(), high.as_py()


def _formatted(kind: pa.DataType, low: Any, high: Any) -> tuple[Any, Any]:
    """``_extremes``'s values as Delta's statistics spell them."""
    if pa.types.is_integer(kind):
        return low, high
    if pa.types.is_date32(kind):
        return low.isoformat(), high.isoformat()
    to_micros = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 0}[kind.unit]
    if to_micros == 0:  # ns: keep the bounds conservative
        return _iso_millis(low // 1000, round_up=False), _iso_millis(
            -(-high // 1000), round_up=True
        )
    return (
        _iso_millis(low * to_micros, round_up=False),
        _iso_millis(high * to_micros, round_up=True),
    )


class StatsFold:
    """Delta statistics of one file, folded over its tables one at a time (all of one
    schema): row count, and per top-level column null counts and min/max where they are
    exact and cheap (integers, dates; timestamps widened to whole milliseconds). Strings,
    binaries, floats and nested columns get none."""

    def __init__(self) -> None:
        self.rows = 0
        self._kinds: dict[str, pa.DataType] = {}
        self._nulls: dict[str, int] = {}
        self._bounds: dict[str, tuple[Any, Any]] = {}

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for name, column in zip(table.column_names, table.columns, strict=True):
            kind = column.type
            if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_floating(kind):
                continue
            self._kinds[name] = kind
            self._nulls[name] = self._nulls.get(name, 0) + column.null_count
            extremes = _extremes(column)
            if extremes is None:
                continue
            low, high = extremes
            if name in self._bounds:
                known_low, known_high = self._bounds[name]
                low, high = min(low, known_low), max(high, known_high)
            self._bounds[name] = (low, high)

    def json(self) -> str:
        minimum: dict[str, Any] = {}
        maximum: dict[str, Any] = {}
        for name, (low, high) in self._bounds.items():
            minimum[name], maximum[name] = _formatted(self._kinds[name], low, high)
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": minimum,
                "maxValues": maximum,
                "nullCount": self._nulls,
            }
        )


def delta_stats(table: pa.Table) -> str:
    """Delta statistics JSON of ``table`` (``StatsFold``)."""
    fold = StatsFold()
    fold.add(table)
    return fold.json()


def sources_of(table: pa.Table) -> tuple[Source, ...]:
    """Which Kafka partitions and offsets a table holds (empty when it lost the
    topic/partition/offset columns, e.g. to a transform)."""
    if table.num_rows == 0 or not {"topic", "partition", "offset"} <= set(table.column_names):
        return ()
    keys = table.select(["topic", "partition", "offset"])
    if keys.column("topic").null_count or keys.column("partition").null_count:
        return ()
    # Not Table.group_by: it imports pyarrow.acero, pyarrow.dataset and pandas (0.25-0.7 s of
    # a local-engine task process's first task). A task holds one partition's rows, mostly.
    topic = keys.column("topic")
    if pa.types.is_dictionary(topic.type):
        topic = topic.cast(topic.type.value_type)
    partition, offset = keys.column("partition"), keys.column("offset")
    found: list[Source] = []
    for name in pc.unique(topic):
        of_topic = pc.equal(topic, name)
        for number in pc.unique(partition.filter(of_topic)):
            bounds = pc.min_max(offset.filter(pc.and_(of_topic, pc.equal(partition, number))))
            found.append(
                Source(
                    name.as_py(), int(number.as_py()), bounds["min"].as_py(), bounds["max"].as_py()
                )
            )
    return tuple(sorted(found))


# -- writing --------------------------------------------------------------------------------


def _partition_string(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    raise SinkError(f"cannot partition by a {type(value).__name__} value ({value!r})")


def _directory(partition_values: Sequence[tuple[str, str | None]]) -> str:
    return "/".join(
        f"{name}={NULL_PARTITION if value is None else quote(value, safe='')}"
        for name, value in partition_values
    )


def _split_by_partition(
    table: pa.Table, partition_by: Sequence[str]
) -> list[tuple[tuple[tuple[str, str | None], ...], pa.Table]]:
    if not partition_by:
        return [((), table)]
    missing = [name for name in partition_by if name not in table.column_names]
    if missing:
        raise SinkError(f"partition columns {missing} are not in the batch's columns")
    keys = table.select(list(partition_by))
    if len(partition_by) == 1:
        unique = pc.unique(keys.column(0))
        if len(unique) == 1:
            return [(((partition_by[0], _partition_string(unique[0].as_py())),), table)]
    index = pa.array(np.arange(table.num_rows, dtype=np.int64))
    groups = (
        keys.append_column("__row", index)
        .group_by(list(partition_by))
        .aggregate([("__row", "list")])
    )
    parts = []
    for row in groups.to_pylist():
        values = tuple((name, _partition_string(row[name])) for name in partition_by)
        rows = pa.array(sorted(row["__row_list"]), pa.int64())
        parts.append((values, table.take(rows)))
    return sorted(parts, key=lambda part: [(v is None, v or "") for _, v in part[0]])


# Unique per record: a dictionary page would be built and thrown away (it was half
# the write time of 100-byte values).
_NO_DICTIONARY = frozenset({"offset", "timestamp", "value"})


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """The one Parquet layout of ingest's data files."""
    dictionary = [
        f.name for f in schema if f.name not in _NO_DICTIONARY and not pa.types.is_nested(f.type)
    ]
    return {"compression": "snappy", "use_dictionary": dictionary}


# A streamed file's row group: rows are buffered up to this much Arrow memory (or
# ROW_GROUP_ROWS rows, pyarrow's default), then written.
ROW_GROUP_BYTES = 64 * 1024**2
ROW_GROUP_ROWS = 1024**2


class DataFileWriter:
    """One data file written a table at a time, in ingest's layout: what compaction
    writes a bin of files with, holding one row group in memory, not the whole file.
    ``close(sources)`` writes the footer's description (its statistics folded over
    every table) and returns the ``DataFile``; ``abort()`` deletes what was written."""

    def __init__(
        self,
        location: TableLocation,
        relative: str,
        schema: pa.Schema,
        *,
        partition_values: tuple[tuple[str, str | None], ...],
        opened: tuple[pafs.FileSystem, str] | None = None,
    ) -> None:
        self.location = location
        self.relative = relative
        self.schema = schema.remove_metadata()
        self.partition_values = partition_values
        self._filesystem, root = opened or location.filesystem()
        self._path = f"{root}/{relative}"
        self._stats = StatsFold()
        self._buffered: list[pa.Table] = []
        self._buffered_bytes = 0
        try:
            if location.local:
                self._filesystem.create_dir(self._path.rpartition("/")[0], recursive=True)
            self._stream = self._filesystem.open_output_stream(self._path)
            self._writer = pq.ParquetWriter(
                self._stream, self.schema, **parquet_options(self.schema)
            )
        except OSError as exc:
            raise SinkError(f"{location.uri}: cannot write {relative}: {exc}") from exc

    def write(self, table: pa.Table) -> None:
        """Adds ``table``'s rows (of the writer's schema) after those written before."""
        self._stats.add(table)
        self._buffered.append(table)
        self._buffered_bytes += table.nbytes
        rows = sum(t.num_rows for t in self._buffered)
        if self._buffered_bytes >= ROW_GROUP_BYTES or rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffered:
            return
        group = pa.concat_tables(self._buffered)
        self._buffered, self._buffered_bytes = [], 0
        try:
            size = min(max(group.num_rows, 1), ROW_GROUP_ROWS)
            self._writer.write_table(group, row_group_size=size)
        except OSError as exc:
            raise SinkError(f"{self.location.uri}: cannot write {self.relative}: {exc}") from exc

    def close(self, sources: tuple[Source, ...]) -> DataFile:
        """Finishes the file; ``sources``: the Kafka offsets its rows hold."""
        stats = self._stats.json()
        description = DataFile(
            path=self.relative,
            size=0,
            partition_values=self.partition_values,
            rows=self._stats.rows,
            stats=stats,
            sources=sources,
            modification_time=0,
        )
        try:
            self._flush()
            self._writer.add_key_value_metadata({FOOTER_KEY: description.to_json().encode()})
            self._writer.close()
            self._stream.close()
            size = self._filesystem.get_file_info(self._path).size
        except OSError as exc:
            raise SinkError(f"{self.location.uri}: cannot write {self.relative}: {exc}") from exc
        return replace(description, size=int(size), modification_time=int(time.time() * 1000))

    def abort(self) -> None:
        """Drops the file (after an error, or when its commit will not happen)."""
        self._buffered = []
        try:
            self._writer.close()
            self._stream.close()
        except (OSError, ValueError):
            pass
        self.location.delete([self.relative])


def write_data_files(
    table: pa.Table,
    location: TableLocation,
    *,
    name: str,
    partition_by: Sequence[str] = (),
    prefix: str = "",
    mapping: ColumnMapping | None = None,
) -> list[DataFile]:
    """Writes ``table`` as one Parquet file per partition value combination, named
    ``<prefix>/<partition dirs>/<name>-<n>.parquet``; an empty table writes nothing.
    ``mapping``: the table's column mapping (files, statistics and partition values then
    carry physical names).

    ``name`` must be unique per writer and deterministic per task, so that a
    retried task overwrites its own files instead of leaving orphans."""
    if table.num_rows == 0:
        return []
    opened = location.filesystem()
    written: list[DataFile] = []
    for number, (values, part) in enumerate(_split_by_partition(table, partition_by)):
        sources = sources_of(part)
        # Delta keeps partition values in the log, not in the files.
        part = part.select([c for c in part.column_names if c not in partition_by])
        if mapping is not None:  # column mapping: physical names, field ids
            part = mapping.physical(part)
            values = tuple((mapping.physical_name(n), v) for n, v in values)
        directory = "/".join(p for p in (prefix.strip("/"), _directory(values)) if p)
        relative = (
            f"{directory}/{name}-{number}.parquet" if directory else f"{name}-{number}.parquet"
        )
        written.append(
            write_data_file(
                location, relative, part, partition_values=values, sources=sources, opened=opened
            )
        )
    return written


def write_data_file(
    location: TableLocation,
    relative: str,
    table: pa.Table,
    *,
    partition_values: tuple[tuple[str, str | None], ...],
    sources: tuple[Source, ...],
    opened: tuple[pafs.FileSystem, str] | None = None,
) -> DataFile:
    """Writes ``table`` (without partition columns) as the data file ``relative``, its
    description in the footer. ``opened``: ``location.filesystem()``, if at hand."""
    writer = DataFileWriter(
        location, relative, table.schema, partition_values=partition_values, opened=opened
    )
    try:
        writer.write(table)
        return writer.close(sources)
    except BaseException:
        writer.abort()
        raise


def read_data_file_footer(location: TableLocation, paths: Iterable[str]) -> list[DataFile]:
    """The ``DataFile`` of files written by ``write_data_files``, from their footers
    (size and time from storage). Missing paths are skipped."""
    filesystem, root = location.filesystem()
    found: list[DataFile] = []
    for relative in paths:
        info = filesystem.get_file_info(f"{root}/{relative}")
        if info.type != pafs.FileType.File:
            continue
        with filesystem.open_input_file(f"{root}/{relative}") as handle:
            metadata = pq.read_metadata(handle).metadata or {}
        described = DataFile.from_json(metadata[FOOTER_KEY])
        found.append(
            DataFile(
                path=relative,
                size=int(info.size),
                partition_values=described.partition_values,
                rows=described.rows,
                stats=described.stats,
                sources=described.sources,
                modification_time=int(info.mtime_ns // 1_000_000)
                if info.mtime_ns
                else int(time.time() * 1000),
            )
        )
    return found
