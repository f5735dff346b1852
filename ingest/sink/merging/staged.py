"""A batch's rows staged as data files inside the table's location (``land.py``), read back
for a MERGE: those to merge, and those without a merge key, which become dead letters.

Upsert's read (``latest_only``) never holds the batch whole: it reads the files twice, a
record batch at a time, first their keys and offsets, then only the rows that are the
last change of their key in their partition. delta-rs's MERGE holds its whole source in a
hash join, so what it gets is what an upsert batch costs (issue 38: 5M changes over 500k
keys peaked at 2.87 GiB read whole, 1.41 GiB so).

The files of one batch may differ in their columns (a task whose writer's schema added
one writes it; the batch's schema is the union): every read lines them up with that
schema by name, a column a file lacks as nulls.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import ConfigError, SinkError
from ingest.sink.files import DataFile
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN

__all__ = ["STREAM_BATCH_ROWS", "null_key_rows", "upsert_source"]

# Rows per record batch of a streamed read of staged files, and the read buffer: what
# memory a read of a file holds beside its output, whatever the size of its row groups.
STREAM_BATCH_ROWS = 65_536
STREAM_BUFFER = 1024**2
KAFKA_COLUMNS = ("topic", "partition", "offset")


def null_key_rows(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Mask of rows with a null merge key (they cannot be upserted)."""
    mask = np.zeros(table.num_rows, bool)
    for key in keys:
        column = table.column(key)
        if column.null_count:
            mask |= column.is_null().to_numpy(zero_copy_only=False)
    return mask


def upsert_source(
    location: TableLocation,
    files: Sequence[DataFile],
    schema: pa.Schema,
    merge_keys: Sequence[str],
    *,
    deletes: bool = False,
    latest_only: bool = False,
) -> tuple[pa.Table, pa.Table | None]:
    """A batch's staged rows to merge (its data files, read back as ``schema``), and
    those without a merge key (None: none). With ``deletes`` the rows must carry
    ``DELETE_COLUMN`` (a null there is a false).

    With ``latest_only`` (and merge keys) only the last change of each key in each
    partition comes back: the one ``merge.upsert`` would keep of them whatever the txn
    versions, since a partition's txn version covers a prefix of its offsets. A table
    with checks leaves it off: every change must be checked, lest a failing last change
    hide an earlier one that passes."""
    missing = [k for k in merge_keys if k not in schema.names]
    if missing:
        raise ConfigError(
            f"merge keys {missing} are not columns of the batch", key="table.merge_keys"
        )
    if deletes and DELETE_COLUMN not in schema.names:
        raise ConfigError(
            f"the rows lack {DELETE_COLUMN}, which marks the rows that delete",
            key="table.transform",
        )
    if merge_keys and any(c not in schema.names for c in KAFKA_COLUMNS):
        lacking = [c for c in KAFKA_COLUMNS if c not in schema.names]
        raise SinkError(f"{location.uri}: upsert rows lack the columns {lacking}")
    if not files:
        rows, keyless = schema.empty_table(), None
    elif latest_only and merge_keys:
        rows, keyless = _latest_rows(location, files, schema, merge_keys)
    else:
        batches = [_aligned(b, schema) for b in _batches(location, files, None)]
        rows = pa.concat_tables(batches) if batches else schema.empty_table()
        mask = null_key_rows(rows, merge_keys)
        keyless = rows.filter(pa.array(mask)) if mask.any() else None
        if keyless is not None:
            rows = rows.filter(pa.array(~mask))
    return _deletes_false(rows), None if keyless is None else _deletes_false(keyless)


def _deletes_false(rows: pa.Table) -> pa.Table:
    """``rows`` with the nulls of ``DELETE_COLUMN`` (if any) made false."""
    if DELETE_COLUMN in rows.column_names and rows.column(DELETE_COLUMN).null_count:
        index = rows.schema.get_field_index(DELETE_COLUMN)
        rows = rows.set_column(
            index, DELETE_COLUMN, pc.fill_null(rows.column(DELETE_COLUMN), False)
        )
    return rows


def _latest_rows(
    location: TableLocation, files: Sequence[DataFile], schema: pa.Schema, keys: Sequence[str]
) -> tuple[pa.Table, pa.Table | None]:
    """``upsert_source``'s ``latest_only`` read: the rows that are the highest offset of
    their key in their topic partition, and the rows without a key (None: none)."""
    narrow_schema = pa.schema([schema.field(c) for c in (*keys, *KAFKA_COLUMNS)])
    narrow: list[pa.Table] = []
    topics: dict[str, int] = {}
    count = 0
    for batch in _batches(location, files, narrow_schema.names):
        rows = _aligned(batch, narrow_schema)  # a key a file lacks: null, a dead letter
        for topic in pc.unique(rows.column("topic")).to_pylist():
            topics.setdefault(topic, len(topics))
        # A topic partition as one number, so the narrow rows hold no strings.
        topic_ids = pc.index_in(rows.column("topic"), value_set=pa.array(list(topics)))
        where = pc.add(
            pc.multiply(topic_ids.cast(pa.int64()), 1 << 32),
            rows.column("partition").cast(pa.int64()),
        )
        narrow.append(
            pa.table(
                [
                    *(rows.column(k) for k in keys),
                    where,
                    rows.column("offset"),
                    pa.array(np.arange(count, count + rows.num_rows, dtype=np.int64)),
                ],
                names=[*keys, "__where", "offset", "__row"],
            )
        )
        count += rows.num_rows
    table = pa.concat_tables(narrow) if narrow else None
    del narrow
    keep = np.zeros(count, bool)
    keyless = np.zeros(count, bool)
    if table is not None:
        keyless = null_key_rows(table, keys)
        if keyless.any():
            table = table.filter(pa.array(~keyless))
        order = pc.sort_indices(table.column("offset"))
        table = table.drop_columns(["offset"]).take(order)
        del order
        last = table.group_by([*keys, "__where"], use_threads=False).aggregate([("__row", "last")])
        del table
        keep[last.column("__row_last").to_numpy()] = True
        del last
    pa.default_memory_pool().release_unused()  # before the merge, whose peak follows
    kept: list[pa.Table] = []
    dropped: list[pa.Table] = []
    start = 0
    for batch in _batches(location, files, None):
        end = start + batch.num_rows
        if keep[start:end].any():
            kept.append(_aligned(batch.filter(keep[start:end]), schema))
        if keyless[start:end].any():
            dropped.append(_aligned(batch.filter(keyless[start:end]), schema))
        start = end
    if start != count:
        raise SinkError(f"the staged files changed while read: {count} rows, then {start}")
    rows = pa.concat_tables(kept) if kept else schema.empty_table()
    return rows, pa.concat_tables(dropped) if dropped else None


def _aligned(batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """``batch`` as ``schema``: its columns by name, cast to the schema's types, nulls
    for a column it lacks."""
    names = batch.schema.names
    columns = [
        batch.column(names.index(f.name)).cast(f.type)
        if f.name in names
        else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _batches(
    location: TableLocation, files: Sequence[DataFile], columns: list[str] | None
) -> Iterator[pa.RecordBatch]:
    """The staged files' rows, in order, a record batch at a time (``columns``: those
    of them a file has), without decoding a whole row group at once."""
    import pyarrow.parquet as pq

    filesystem, root = location.filesystem()
    for file in files:
        with filesystem.open_input_file(f"{root}/{file.path}") as source:
            reader = pq.ParquetFile(source, pre_buffer=False, buffer_size=STREAM_BUFFER)
            wanted = (
                None if columns is None else [c for c in columns if c in reader.schema_arrow.names]
            )
            yield from reader.iter_batches(
                batch_size=STREAM_BATCH_ROWS, columns=wanted, use_threads=True
            )
