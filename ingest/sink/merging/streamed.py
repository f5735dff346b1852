"""An upsert's MERGE done file by file, for a plain table: memory bounded by the batch and
one data file, not by the table.

delta-rs's MERGE joins the batch with the whole table at once: its driver's memory grew
with the table (0.54 GiB against 500k keys, 1.43 GiB against 5M, docs/benchmarks.md).
Here the batch's keys (``rows``: one change per key, re-filtered by the txn versions, as
``merge.upsert`` gives them) are joined with one data file's keys at a time:

* a row of the file whose key a change matches, where the MERGE's ``UPDATE_WHEN`` holds
  (another partition's change, or a later offset of the same one), is taken out: the file
  is removed and, when other rows remain, rewritten without it next to it
  (``rewrite.py``'s naming);
* a change that matched a row where ``UPDATE_WHEN`` does not hold is dropped (an older
  change of the same partition: the MERGE's "matched, no clause applies");
* every other change that is no delete is written as new data files.

The removes, the rewritten files and the new ones are one commit with the batch's txns and
the rewrite guard (``DeltaTarget.try_commit``, no blind append); delta-rs refuses it when a
concurrent commit removed a file this one removes ("a concurrent transaction deleted data
this operation read"), and the caller merges again from a new snapshot. It also merges
again when a commit since the snapshot added rows (``appended_since``; delta-rs records
nothing such a commit read, so it sees no conflict there); a rival commit landing between
that look and the commit is not seen (a window of one log listing, where delta-rs's MERGE
would conflict). The result is the
MERGE of ``merge.py``'s docstring, row for row, when the table holds each key once (an
upsert table does); where a key is held twice, the MERGE would update both rows, this
keeps one.

For tables without partition columns, column mapping or any other table feature
(``streamable``); the others keep delta-rs's or Delta Spark's MERGE, which write change
data, honour deletion vectors and compute generated columns.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from ingest.errors import SinkError
from ingest.sink.files import DataFile, write_data_files
from ingest.sink.maintenance.rewrite import read_data_file, write_remainder
from ingest.sink.metadata.evolution import mapping_of
from ingest.sink.metadata.features import active_features
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN

__all__ = ["StreamedMerge", "appended_since", "merge_file_by_file", "streamable"]

# Features that change nothing of how rows are read, written or removed.
_NEUTRAL = frozenset({"timestampNtz"})
_T_PARTITION, _T_OFFSET, _T_ROW = "__t_partition", "__t_offset", "__t_row"
_S_PARTITION, _S_OFFSET, _S_ROW = "__s_partition", "__s_offset", "__s_row"


def streamable(table: DeltaTable, columns: Sequence[str]) -> bool:
    """Whether ``table``'s upserts of rows with ``columns`` can go file by file: no
    partition columns, no column mapping, no feature but the neutral ones, and no column
    the rows lack (a MERGE's update keeps such a column's value; a rewrite would not)."""
    if table.metadata().partition_columns or mapping_of(table) is not None:
        return False
    if set(active_features(table)) - _NEUTRAL:
        return False
    return {f.name for f in table.schema().fields} <= set(columns)


@dataclass(frozen=True)
class StreamedMerge:
    """A MERGE's actions (removes, rewritten files, new files), the files it wrote (to
    delete if its commit loses), and its row counts as delta-rs's metrics name them."""

    actions: tuple[AddAction | RemoveAction, ...]
    written: tuple[DataFile, ...]
    inserted: int
    updated: int
    deleted: int


def merge_file_by_file(
    location: TableLocation,
    table: DeltaTable,
    rows: pa.Table,
    merge_keys: Sequence[str],
    attempt: int,
) -> StreamedMerge:
    """The MERGE of ``rows`` (one change per key; ``DELETE_COLUMN`` marks deletes) into
    ``table``'s current snapshot, as actions to commit. ``SinkError`` when a data file
    cannot be read or its keys cannot be compared; the files written so far are deleted."""
    written: list[DataFile] = []
    try:
        return _merge(location, table, rows, merge_keys, attempt, written)
    except (OSError, pa.ArrowException) as exc:
        location.delete(f.path for f in written)
        raise SinkError(f"{location.uri}: merging file by file failed: {exc}") from exc
    except BaseException:
        location.delete(f.path for f in written)
        raise


def _merge(
    location: TableLocation,
    table: DeltaTable,
    rows: pa.Table,
    merge_keys: Sequence[str],
    attempt: int,
    written: list[DataFile],
) -> StreamedMerge:
    count = rows.num_rows
    deleting = (
        np.asarray(pc.fill_null(rows.column(DELETE_COLUMN), False), dtype=bool)
        if DELETE_COLUMN in rows.column_names
        else np.zeros(count, bool)
    )
    changes = _key_table(rows, merge_keys, (_S_PARTITION, _S_OFFSET, _S_ROW))
    applied = np.zeros(count, bool)  # matched, UPDATE_WHEN held: updated or deleted
    blocked = np.zeros(count, bool)  # matched, UPDATE_WHEN did not hold: nothing done
    opened = location.filesystem()
    actions: list[AddAction | RemoveAction] = []
    removed_at = int(time.time() * 1000)
    listing = pa.table(table.get_add_actions(flatten=False)).select(["path", "size_bytes"])
    wanted = [*merge_keys, "partition", "offset"]
    for path, size in zip(
        listing.column("path").to_pylist(), listing.column("size_bytes").to_pylist(), strict=True
    ):
        # The keys first; the whole file only when a change matches one of its rows.
        held = read_data_file(opened, path, wanted)
        if held.num_rows == 0 or any(k not in held.column_names for k in merge_keys):
            continue  # a file without a key column: every key of it is null
        keys = _key_table(held, merge_keys, (_T_PARTITION, _T_OFFSET, _T_ROW))
        matched = _matches(keys, changes, merge_keys)
        if matched.num_rows == 0:
            continue
        # SQL's OR (Kleene): a null on one side does not hide a true on the other.
        when = pc.fill_null(
            pc.or_kleene(
                pc.not_equal(matched.column(_S_PARTITION), matched.column(_T_PARTITION)),
                pc.greater(matched.column(_S_OFFSET), matched.column(_T_OFFSET)),
            ),
            False,
        )
        hit = np.asarray(when, dtype=bool)
        change_rows = np.asarray(matched.column(_S_ROW), dtype=np.int64)
        applied[change_rows[hit]] = True
        blocked[change_rows[~hit]] = True
        taken = np.unique(np.asarray(matched.column(_T_ROW), dtype=np.int64)[hit])
        if taken.size == 0:
            continue
        actions.append(RemoveAction(path, True, removed_at, size=int(size)))
        if taken.size < held.num_rows:
            keep = np.ones(held.num_rows, bool)
            keep[taken] = False
            whole = read_data_file(opened, path)
            remainder = write_remainder(
                location, opened, path, (), whole.filter(keep), attempt, None
            )
            written.append(remainder)
            actions.append(remainder.add_action())
    inserting = ~deleting & ~blocked
    table_rows = rows.drop_columns([DELETE_COLUMN]) if DELETE_COLUMN in rows.column_names else rows
    new = write_data_files(
        table_rows.filter(pa.array(inserting)),
        location,
        name=f"m{attempt}-{uuid.uuid4().hex}",
    )
    written.extend(new)
    actions.extend(f.add_action() for f in new)
    return StreamedMerge(
        actions=tuple(actions),
        written=tuple(written),
        inserted=int(np.count_nonzero(inserting & ~applied)),
        updated=int(np.count_nonzero(inserting & applied)),
        deleted=int(np.count_nonzero(deleting & applied)),
    )


def _key_table(rows: pa.Table, merge_keys: Sequence[str], names: tuple[str, str, str]) -> pa.Table:
    """``rows``' merge keys, partition and offset (null where a file lacks them: another
    writer's; UPDATE_WHEN is then null there) and row number, under ``names`` (so a merge
    key named partition or offset does not clash)."""
    keyed = rows.select(list(merge_keys))
    for name, source, kind in (
        (names[0], "partition", pa.int32()),
        (names[1], "offset", pa.int64()),
    ):
        column = rows.column(source) if source in rows.column_names else pa.nulls(len(rows), kind)
        keyed = keyed.append_column(name, column)
    return keyed.append_column(names[2], pa.array(np.arange(rows.num_rows, dtype=np.int64)))


def _matches(keys: pa.Table, changes: pa.Table, merge_keys: Sequence[str]) -> pa.Table:
    """The (row, change) pairs whose merge keys are equal (nulls never are). A file's key
    column of another type than the batch's is compared in the batch's type, or the batch's
    in the file's when a file value does not fit."""

    def retyped(table: pa.Table, like: pa.Table) -> pa.Table:
        """``table`` with its key columns in ``like``'s types."""
        fields = [
            like.schema.field(name) if name in merge_keys else table.schema.field(name)
            for name in table.column_names
        ]
        return table.cast(pa.schema(fields))

    try:
        return retyped(keys, changes).join(
            changes, list(merge_keys), join_type="inner", use_threads=False
        )
    except pa.ArrowInvalid:
        return keys.join(
            retyped(changes, keys), list(merge_keys), join_type="inner", use_threads=False
        )


def appended_since(location: TableLocation, table: DeltaTable) -> bool:
    """Whether a commit after ``table``'s version added rows (an ``add`` that changes
    data): one may hold a key this merge inserts. delta-rs's conflict checks see no such
    conflict in a commit of add and remove actions (it records nothing the commit read), so
    the caller merges again from the new snapshot, as a MERGE that lost its race would."""
    filesystem, root = location.filesystem()
    version = table.version() + 1
    while True:
        try:
            with filesystem.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as log:
                text = log.read().decode()
        except FileNotFoundError:
            return False
        for line in text.splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action and action["add"].get("dataChange", True):
                return True
        version += 1
