"""Compaction: a table's small data files rewritten as fewer, bigger ones, the data unchanged.

``compact(location, target_size=...)`` takes the live files smaller than half of
``target_size`` (a bigger one is done: with a file of its size it would pass the target,
and merged with small ones it would be rewritten at every pass, as the small files that
land while a pass runs are older than its output), groups them by partition values, packs each group's files (oldest
first, so row order is kept) into bins of at most ``target_size`` input bytes, and
writes each bin of two or more files as one Parquet file in ingest's layout
(``files.DataFileWriter``: its statistics, and its footer saying which Kafka
partitions and offsets it holds, several per file now). A bin is streamed, one input
row group at a time, so a pass holds about a row group of rows whatever the target size. ONE commit then removes
the inputs and adds the outputs, every action ``dataChange=false`` (a streaming
reader skips it), with the rewrite guard's txn (``txn.guard_transaction``).

Why not delta-rs's ``optimize.compact``: it cannot carry a txn action (its
``commit_properties`` drop ``app_transactions``), and delta-rs lets a commit
remove files a concurrent commit removed with ``dataChange=false``. Two
compactions planned on one snapshot both go through, as does an overwrite's cut
or a MERGE after a compaction of the files it read: the rows land twice
(``tests/sink/test_compact.py`` pins this). With the guard, every pair of
commits that remove files conflicts and the loser retries (the overwrite, the
merge) or gives up until the next pass (a compaction, which deletes what it wrote).

A file that carries a deletion vector is left as it is (its rows are not read without
the vector's deleted ones, and its remove could not name the vector: delta-rs's
``RemoveAction`` has no such field); the other files are compacted around it.

Concurrent appends (ingest's batches) remove nothing and carry no guard: they
never conflict with a compaction, and delta-rs rebases either over the other.
A compaction only reads committed files: a batch's files in flight are not in
the snapshot.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from ingest.errors import SinkError
from ingest.protocol.partition import Partition
from ingest.sink.files import FOOTER_KEY, DataFile, DataFileWriter, Source, sources_of
from ingest.sink.maintenance.rewrite import partition_text, plain_type
from ingest.sink.metadata.evolution import mapping_of
from ingest.sink.metadata.mapping import ColumnMapping, logical, physical_name
from ingest.sink.storage import TableLocation
from ingest.sink.txn import guard_transaction

__all__ = ["COMPACTION_KEY", "Compaction", "compact", "plan_bins", "vector_paths"]

log = logging.getLogger("ingest.sink")

# In the commitInfo of a compaction (``DESCRIBE HISTORY`` tells it from a batch).
COMPACTION_KEY = "ingest.compaction"


@dataclass(frozen=True)
class Compaction:
    """What one compaction did: the table version it committed (None: no commit),
    files removed and added, the rows they hold, and whether it lost a race."""

    version: int | None
    files_removed: int
    files_added: int
    rows: int
    bytes_read: int
    lost_race: bool = False


@dataclass(frozen=True)
class _Entry:
    path: str
    size: int
    rows: int | None
    partition_values: tuple[tuple[str, str | None], ...]
    modification_time: int


def plan_bins(entries: Sequence[_Entry], target_size: int) -> list[list[_Entry]]:
    """Files smaller than half of ``target_size``, by partition values, packed oldest
    first into bins of at most ``target_size`` bytes; only bins of two files or more."""
    groups: dict[tuple[tuple[str, str | None], ...], list[_Entry]] = {}
    for entry in entries:
        if entry.size < target_size // 2:
            groups.setdefault(entry.partition_values, []).append(entry)
    bins: list[list[_Entry]] = []
    for values in sorted(groups, key=lambda key: [(v is None, v or "") for _, v in key]):
        members = groups[values]
        current: list[_Entry] = []
        filled = 0
        for entry in sorted(members, key=lambda e: (e.modification_time, e.path)):
            if current and filled + entry.size > target_size:
                bins.append(current)
                current, filled = [], 0
            current.append(entry)
            filled += entry.size
        bins.append(current)
    return [b for b in bins if len(b) >= 2]


def vector_paths(table: DeltaTable, listing: pa.Table | None = None) -> set[str]:
    """The live files of a snapshot that carry a deletion vector (their paths as
    ``get_add_actions`` names them; ``listing``: its flattened table, if read already).
    delta-rs 1.6 lists no vector with the adds: ``deletion_vectors()`` names the files (and
    holds each one's selection, a bool per row, in memory meanwhile)."""
    if "deletionVectors" not in (table.protocol().reader_features or []):
        return set()
    if listing is None:
        listing = pa.table(table.get_add_actions(flatten=True))
    known = set(listing.column("path").to_pylist())
    root = table.table_uri.rstrip("/") + "/"
    found: set[str] = set()
    for uri in pa.table(table.deletion_vectors().read_all()).column("filepath").to_pylist():
        path = unquote(uri[len(root) :]) if uri.startswith(root) else ""
        if path not in known:
            raise SinkError(
                f"{table.table_uri}: delta-rs names a deletion vector's file {uri!r}, which is "
                "not one of the table's live files; not compacting"
            )
        found.add(path)
    return found


def _entries(table: DeltaTable, *, with_vectors: bool = True) -> list[_Entry]:
    """The snapshot's live files; without those that carry a deletion vector unless
    ``with_vectors``."""
    listing = pa.table(table.get_add_actions(flatten=True))
    skipped = set() if with_vectors else vector_paths(table, listing)
    columns = [c for c in listing.column_names if c.startswith("partition.")]
    entries = []
    for row in listing.to_pylist():
        if row["path"] in skipped:
            continue
        entries.append(
            _Entry(
                path=row["path"],
                size=int(row["size_bytes"]),
                rows=row.get("num_records"),
                partition_values=tuple(
                    (c.removeprefix("partition."), partition_text(row[c])) for c in columns
                ),
                modification_time=int(
                    row["modification_time"].timestamp() * 1000
                    if hasattr(row["modification_time"], "timestamp")
                    else row["modification_time"]
                ),
            )
        )
    return entries


def compact(
    location: TableLocation, *, target_size: int, table: DeltaTable | None = None
) -> Compaction:
    """Compacts ``location``'s table (see the module docstring); ``table``: its snapshot,
    if already loaded (the plan is taken from it)."""
    if table is None:
        try:
            table = DeltaTable(location.uri, storage_options=location.delta_options())
        except DeltaError as exc:
            raise SinkError(f"{location.uri}: cannot load the table: {exc}") from exc
    # A file with a deletion vector stays as it is: the remove that would take it out must
    # name its vector, which delta-rs's RemoveAction cannot (ingest.sink.metadata.features).
    bins = plan_bins(_entries(table, with_vectors=False), target_size)
    if not bins:
        return Compaction(None, 0, 0, 0, 0)
    # Column mapping: the files' columns (kept as they are) and the adds' partition values
    # go by physical names; the Kafka offsets a file holds are found by logical ones.
    mapping = mapping_of(table)
    opened = location.filesystem()
    written: list[DataFile] = []
    removed_at = int(time.time() * 1000)
    removes: list[RemoveAction] = []
    read = rows = 0
    try:
        for members in bins:
            directory, _, _ = members[0].path.rpartition("/")
            name = f"compact-{uuid.uuid4().hex}.parquet"
            relative = f"{directory}/{name}" if directory else name
            written.append(_write_bin(location, opened, members, relative, mapping))
            read += sum(m.size for m in members)
            rows += written[-1].rows
            removes.extend(
                RemoveAction(
                    m.path,
                    False,
                    removed_at,
                    size=m.size,
                    partition_values=dict(m.partition_values) or None,
                )
                for m in members
            )
        adds = [
            AddAction(
                f.path,
                f.size,
                {physical_name(mapping, k): v for k, v in f.partition_values},
                f.modification_time,
                False,
                f.stats,
            )
            for f in written
        ]
        token = uuid.uuid4().hex
        table.create_write_transaction(
            [*removes, *adds],
            "append",
            table.schema(),
            partition_by=list(table.metadata().partition_columns) or None,
            commit_properties=CommitProperties(
                custom_metadata={COMPACTION_KEY: token},
                app_transactions=[guard_transaction(table)],
                max_commit_retries=15,
            ),
        )
    except CommitFailedError as exc:
        location.delete(f.path for f in written)
        log.info("%s: compaction lost a race, nothing changed: %s", location.uri, exc)
        return Compaction(None, 0, 0, 0, read, lost_race=True)
    except BaseException:
        location.delete(f.path for f in written)
        raise
    finally:
        # What the pass allocated goes back to the system (mimalloc keeps freed pages).
        pa.default_memory_pool().release_unused()
    version = _version_of(location, token)
    log.info(
        "%s: compacted %d files into %d (%d rows) at version %s",
        location.uri,
        len(removes),
        len(written),
        rows,
        version,
    )
    return Compaction(version, len(removes), len(written), rows, read)


def _write_bin(
    location: TableLocation,
    opened: tuple[Any, str],
    members: Sequence[_Entry],
    relative: str,
    mapping: ColumnMapping | None,
) -> DataFile:
    """A bin's files written as the one file ``relative``, their rows in order, one input
    row group at a time (memory: a row group of each side, whatever the bin's size)."""
    filesystem, root = opened
    schema = _bin_schema(opened, members)
    writer = DataFileWriter(
        location, relative, schema, partition_values=members[0].partition_values, opened=opened
    )
    try:
        described: list[tuple[Source, ...] | None] = []
        found: list[Source] = []
        complete = True  # every row's offsets are in its own columns
        for member in members:
            with filesystem.open_input_file(f"{root}/{member.path}") as handle:
                parquet = pq.ParquetFile(handle)
                raw = (parquet.metadata.metadata or {}).get(FOOTER_KEY)
                described.append(None if raw is None else DataFile.from_json(raw).sources)
                for group in range(parquet.num_row_groups):
                    part = _aligned(parquet.read_row_group(group), schema)
                    sources = sources_of(logical(mapping, part))
                    complete = complete and (bool(sources) or part.num_rows == 0)
                    found.extend(sources)
                    writer.write(part)
        if complete and found:
            merged = _merged(found)
        elif all(d for d in described):
            merged = _merged([s for d in described if d for s in d])
        else:
            merged = ()
        return writer.close(merged)
    except BaseException:
        writer.abort()
        raise


def _bin_schema(opened: tuple[Any, str], members: Sequence[_Entry]) -> pa.Schema:
    """The schema of a bin's files together, from their footers: view types made plain
    (delta-rs 1.6's DELETE writes ``string_view``; the Parquet types are the same), a
    column some file lacks nullable (its rows there are null)."""
    filesystem, root = opened
    schemas = []
    for member in members:
        with filesystem.open_input_file(f"{root}/{member.path}") as handle:
            found = pq.read_schema(handle).remove_metadata()
        schemas.append(pa.schema([f.with_type(plain_type(f.type)) for f in found]))
    try:
        unified = pa.unify_schemas(schemas, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SinkError(
            f"cannot compact {members[0].path} with {len(members) - 1} more files: their "
            f"schemas do not agree: {exc}"
        ) from exc
    everywhere = set.intersection(*(set(s.names) for s in schemas))
    return pa.schema([f if f.name in everywhere else f.with_nullable(True) for f in unified])


def _aligned(part: pa.Table, schema: pa.Schema) -> pa.Table:
    """``part``'s columns in ``schema``'s order and types; a column it lacks, nulls."""
    columns = []
    for field in schema:
        if field.name not in part.column_names:
            columns.append(pa.nulls(part.num_rows, field.type))
            continue
        column = part.column(field.name)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _merged(sources: Sequence[Source]) -> tuple[Source, ...]:
    """Each Kafka partition's offsets across several files' sources (a bounding range)."""
    bounds: dict[Partition, tuple[int, int]] = {}
    for s in sources:
        key = Partition(s.topic, s.partition)
        low, high = bounds.get(key, (s.min_offset, s.max_offset))
        bounds[key] = (min(low, s.min_offset), max(high, s.max_offset))
    return tuple(sorted(Source(t, p, lo, hi) for (t, p), (lo, hi) in bounds.items()))


def _version_of(location: TableLocation, token: str) -> int | None:
    table = DeltaTable(location.uri, storage_options=location.delta_options())
    for entry in table.history(limit=50):
        if entry.get(COMPACTION_KEY) == token:
            return int(entry["version"])
    return None


def live_files(table: DeltaTable) -> Mapping[str, int]:
    """The live data files of a snapshot and their sizes (for reports and tests)."""
    return {e.path: e.size for e in _entries(table)}
