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
the rewrite guard (``DeltaTarget.try_commit``); delta-rs refuses it when a concurrent
commit removed a file this one removes ("a concurrent transaction deleted data this
operation read"), and the caller merges again from a new snapshot. The result is the
MERGE of ``merge.py``'s docstring, row for row, when the table holds each key once (an
upsert table does); where a key is held twice, the MERGE would update both rows, this
keeps one.

For tables without partition columns, column mapping or any other table feature
(``streamable``); the others keep delta-rs's or Delta Spark's MERGE, which write change
data, honour deletion vectors and compute generated columns.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from ingest.sink.files import DataFile, write_data_files
from ingest.sink.maintenance.rewrite import read_data_file, write_remainder
from ingest.sink.metadata.evolution import mapping_of
from ingest.sink.metadata.features import active_features
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN

__all__ = ["StreamedMerge", "merge_file_by_file", "streamable"]

# Features that change nothing of how rows are read, written or removed.
_NEUTRAL = frozenset({"timestampNtz"})
_ROW, _S_ROW, _S_PARTITION, _S_OFFSET = "__t_row", "__s_row", "__s_partition", "__s_offset"


def streamable(table: DeltaTable) -> bool:
    """Whether ``table``'s upserts can go file by file: no partition columns, no column
    mapping, no feature but the neutral ones."""
    if table.metadata().partition_columns or mapping_of(table) is not None:
        return False
    return not set(active_features(table)) - _NEUTRAL


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
    ``table``'s current snapshot, as actions to commit."""
    count = rows.num_rows
    deleting = (
        np.asarray(pc.fill_null(rows.column(DELETE_COLUMN), False), dtype=bool)
        if DELETE_COLUMN in rows.column_names
        else np.zeros(count, bool)
    )
    changes = rows.select(list(merge_keys))
    changes = changes.append_column(_S_PARTITION, rows.column("partition"))
    changes = changes.append_column(_S_OFFSET, rows.column("offset"))
    changes = changes.append_column(_S_ROW, pa.array(np.arange(count, dtype=np.int64)))
    applied = np.zeros(count, bool)  # matched, UPDATE_WHEN held: updated or deleted
    blocked = np.zeros(count, bool)  # matched, UPDATE_WHEN did not hold: nothing done
    opened = location.filesystem()
    actions: list[AddAction | RemoveAction] = []
    written: list[DataFile] = []
    removed_at = int(time.time() * 1000)
    listing = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
    for path, size in zip(
        listing.column("path").to_pylist(), listing.column("size_bytes").to_pylist(), strict=True
    ):
        held = read_data_file(opened, path)
        if held.num_rows == 0 or any(k not in held.column_names for k in merge_keys):
            continue  # a file without a key column: every key of it is null
        keys = held.select(list(merge_keys))
        for name, kind in (("partition", pa.int32()), ("offset", pa.int64())):
            # Another writer's file without them: UPDATE_WHEN is null there, never true.
            column = held.column(name) if name in held.column_names else pa.nulls(len(held), kind)
            keys = keys.append_column(name, column)
        keys = keys.append_column(_ROW, pa.array(np.arange(held.num_rows, dtype=np.int64)))
        typed = changes.cast(
            pa.schema(
                [
                    *(keys.schema.field(k) for k in merge_keys),
                    *(changes.schema.field(c) for c in (_S_PARTITION, _S_OFFSET, _S_ROW)),
                ]
            )
        )
        matched = keys.join(typed, list(merge_keys), join_type="inner", use_threads=False)
        if matched.num_rows == 0:
            continue
        when = pc.fill_null(
            pc.or_(
                pc.not_equal(matched.column(_S_PARTITION), matched.column("partition")),
                pc.greater(matched.column(_S_OFFSET), matched.column("offset")),
            ),
            False,
        )
        hit = np.asarray(when, dtype=bool)
        change_rows = np.asarray(matched.column(_S_ROW), dtype=np.int64)
        applied[change_rows[hit]] = True
        blocked[change_rows[~hit]] = True
        taken = np.unique(np.asarray(matched.column(_ROW), dtype=np.int64)[hit])
        if taken.size == 0:
            continue
        actions.append(RemoveAction(path, True, removed_at, size=int(size)))
        if taken.size < held.num_rows:
            keep = np.ones(held.num_rows, bool)
            keep[taken] = False
            remainder = write_remainder(
                location, opened, path, (), held.filter(keep), attempt, None
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
