"""Upsert mode: MERGE a batch into the table by its merge keys, with the batch's txn actions.

The batch is first re-filtered by the table's txn versions (invariant 2 holds
for upserts too) and deduplicated by key, the highest offset winning; delta-rs
refuses a source with duplicate keys. Then::

    MERGE INTO t USING s ON t.k1 = s.k1 AND ...
    WHEN MATCHED AND s._delete AND (s.partition <> t.partition OR s.offset > t.offset)
        THEN DELETE
    WHEN MATCHED AND NOT s._delete AND (s.partition <> t.partition OR s.offset > t.offset)
        THEN UPDATE * (but _delete)
    WHEN NOT MATCHED AND NOT s._delete THEN INSERT * (but _delete)

so a replay of older offsets never overwrites newer values of the same
partition, nor deletes them (offsets of different partitions are not
comparable: a key that moved partition takes the change merged last). Rows
marked in ``_delete`` (tombstones, Debezium deletes) take part in the dedupe
like any other, so within a batch the last change of a key by offset decides
between a delete and an update; the column never reaches the table. Without
``_delete`` (no row of the batch can delete) the first clause is left out. A
deleted row leaves nothing behind: another group replaying offsets older than a
delete re-inserts their values (the txn filter keeps a group's own replays
out). A merge that changes nothing
makes no commit and would lose its txn actions, so those are then recorded by
an empty commit. A merge carries the rewrite guard's txn
(``txn.guard_transaction``), so it conflicts with a concurrent compaction of
the files it rewrites. ``CommitFailedError`` (a concurrent merge or compaction won): back off,
re-read the txn versions, re-filter and merge again. Files written by a merge
that lost its race are left for VACUUM (delta-rs does not name them).

A plain table (no partition columns, column mapping or other feature) is merged file by
file instead (``streamed.py``): the same clauses, with memory bounded by the batch and one
data file rather than by the table; its lost races delete the files they wrote.

A batch's rows reach the merge as data files staged inside the table's location
(``land.py``): ``staged.upsert_source`` reads them back, keeping only each key's
last change in each partition when the table has no checks, and splits off the
rows whose merge key is null, which become dead letters.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Schema
from deltalake.exceptions import CommitFailedError, DeltaError

from ingest.errors import SinkError
from ingest.sink.delta import CommitOutcome, DeltaTarget
from ingest.sink.merging.streamed import appended_since, merge_file_by_file, streamable
from ingest.sink.metadata.evolution import evolve, nullable_schema, schema_changes
from ingest.sink.table_config import DELETE_COLUMN
from ingest.sink.txn import (
    MergeClauses,
    MergeDone,
    TableCommitter,
    commit_properties,
    newer_txns,
)

__all__ = [
    "latest_per_key",
    "merge_per_partition",
    "merge_predicate",
    "refilter_rows",
    "upsert",
]

log = logging.getLogger("ingest.sink")

UPDATE_WHEN = "s.`partition` <> t.`partition` OR s.`offset` > t.`offset`"
_DELETE = f"s.`{DELETE_COLUMN}`"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def merge_predicate(keys: Sequence[str]) -> str:
    return " AND ".join(f"t.{_quoted(k)} = s.{_quoted(k)}" for k in keys)


def latest_per_key(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """One row per key: the one with the highest offset (``table`` itself when its keys
    are distinct; only the keys and offsets are sorted, never the whole rows)."""
    if table.num_rows <= 1:
        return table
    order = pc.sort_indices(table.column("offset"))
    keyed = table.select(list(keys)).append_column(
        "__row", pa.array(np.arange(table.num_rows, dtype=np.int64))
    )
    last = keyed.take(order).group_by(list(keys), use_threads=False).aggregate([("__row", "last")])
    if last.num_rows == table.num_rows:
        return table
    return table.take(np.sort(last.column("__row_last").to_numpy()))


def refilter_rows(
    table: pa.Table,
    current: Mapping[str, int | None],
    app_id_of: Callable[[str, int], str],
) -> pa.Table:
    """``table``'s rows above the txn version (``current``, by app id) of their partition."""
    if table.num_rows == 0:
        return table
    drop = None
    pairs = table.select(["topic", "partition"]).group_by(["topic", "partition"]).aggregate([])
    for row in pairs.to_pylist():
        version = current.get(app_id_of(row["topic"], row["partition"]))
        if version is None:
            continue
        covered = pc.and_(
            pc.and_(
                pc.equal(table.column("topic"), row["topic"]),
                pc.equal(table.column("partition"), row["partition"]),
            ),
            pc.less_equal(table.column("offset"), version),
        )
        drop = covered if drop is None else pc.or_(drop, covered)
    if drop is None or not pc.any(drop).as_py():
        return table  # no copy of a batch the txn versions leave whole
    return table.filter(pc.invert(drop))


def upsert(
    target: DeltaTarget,
    source: pa.Table,
    *,
    merge_keys: Sequence[str],
    txns: Mapping[str, int],
    app_id_of: Callable[[str, int], str],
) -> CommitOutcome:
    """Merges ``source`` (rows with topic, partition, offset and the merge keys) into
    the table, recording ``txns`` (app id -> last offset) with it."""
    missing = [
        c for c in (*merge_keys, "topic", "partition", "offset") if c not in source.schema.names
    ]
    if missing:
        raise SinkError(f"{target.uri}: upsert rows lack the columns {missing}")
    schema = nullable_schema(source.schema)
    source = source.cast(schema)
    deleting = DELETE_COLUMN in schema.names
    if deleting:
        schema = schema.remove(schema.get_field_index(DELETE_COLUMN))  # the table's
    for attempt in range(1, target.max_attempts + 1):
        table = target.load()
        target.check_partitioning(table)
        if table is None:
            target.create_empty(schema)
            continue
        committer = target.committer_for(table, "upsert")
        if committer is not None:
            return _through_delta_spark(
                target, committer, source, schema, merge_keys, txns, app_id_of
            )
        current = DeltaTarget.versions_in(table, list(txns))
        rows = latest_per_key(refilter_rows(source, current, app_id_of), merge_keys)
        wanted = newer_txns(txns, current)
        if rows.num_rows == 0 and not wanted:
            return CommitOutcome(table.version(), (), 0, current, attempt, committed=False)
        token = uuid.uuid4().hex
        try:
            if evolve(target.uri, table, schema):
                table = target.load() or table
            metrics: dict[str, int] = {}
            if rows.num_rows and streamable(table, rows.column_names):  # file by file: streamed.py
                merged = merge_file_by_file(target.location, table, rows, merge_keys, attempt)
                if appended_since(target.location, table):  # a lost race delta-rs cannot see
                    log.info("%s: rows were added since the merge's snapshot", target.uri)
                    target.location.delete(f.path for f in merged.written)
                    target.backoff(attempt)
                    continue
                done = target.try_commit(
                    table, merged.actions, wanted, attempt, "merge", guarded=True, read=True
                )
                if done is None:  # lost a race (backed off)
                    target.location.delete(f.path for f in merged.written)
                    continue
                log.info(
                    "%s: merged file by file: %d inserted, %d updated, %d deleted",
                    target.uri,
                    merged.inserted,
                    merged.updated,
                    merged.deleted,
                )
                return CommitOutcome(
                    target.version_of(done),
                    (),
                    merged.inserted + merged.updated,
                    {**current, **wanted},
                    attempt,
                    committed=True,
                    dropped_rows=source.num_rows - rows.num_rows,
                    deleted_rows=merged.deleted,
                )
            if rows.num_rows:
                merger = table.merge(
                    rows,
                    predicate=merge_predicate(merge_keys),
                    source_alias="s",
                    target_alias="t",
                    commit_properties=commit_properties(token, wanted, guarded=table),
                )
                if deleting:
                    merger = (
                        merger.when_matched_delete(predicate=f"{_DELETE} AND ({UPDATE_WHEN})")
                        .when_matched_update_all(
                            predicate=f"NOT {_DELETE} AND ({UPDATE_WHEN})",
                            except_cols=[DELETE_COLUMN],
                        )
                        .when_not_matched_insert_all(
                            predicate=f"NOT {_DELETE}", except_cols=[DELETE_COLUMN]
                        )
                    )
                else:
                    merger = merger.when_matched_update_all(
                        predicate=UPDATE_WHEN
                    ).when_not_matched_insert_all()
                metrics = merger.execute()
        except CommitFailedError as exc:
            log.info("%s: merge attempt %d lost a race: %s", target.uri, attempt, exc)
            target.backoff(attempt)
            continue
        except DeltaError as exc:
            raise SinkError(f"{target.uri}: merge failed: {exc}") from exc
        after = target.versions(list(wanted))
        if any(after[app] != version for app, version in wanted.items()):
            # The merge changed nothing, so it made no commit: record the txns alone.
            outcome = target.commit_txns(wanted, schema)
            version = outcome.version
        else:
            version = target.version_of(token)
        changed = int(metrics.get("num_target_rows_inserted", 0)) + int(
            metrics.get("num_target_rows_updated", 0)
        )
        return CommitOutcome(
            version,
            (),
            changed,
            {**current, **wanted},
            attempt,
            committed=True,
            dropped_rows=source.num_rows - rows.num_rows,
            deleted_rows=int(metrics.get("num_target_rows_deleted", 0)),
        )
    raise SinkError(f"{target.uri}: no merge after {target.max_attempts} attempts")


def _clauses(
    merge_keys: Sequence[str], columns: Sequence[str], deleting: bool, txn: tuple[str, int]
) -> MergeClauses:
    """The MERGE of the module docstring, for Delta Spark."""
    if not deleting:
        return MergeClauses(
            merge_predicate(merge_keys), UPDATE_WHEN, None, None, tuple(columns), txn
        )
    return MergeClauses(
        merge_predicate(merge_keys),
        f"NOT {_DELETE} AND ({UPDATE_WHEN})",
        f"{_DELETE} AND ({UPDATE_WHEN})",
        f"NOT {_DELETE}",
        tuple(columns),
        txn,
    )


def _through_delta_spark(
    target: DeltaTarget,
    committer: TableCommitter,
    source: pa.Table,
    schema: pa.Schema,
    merge_keys: Sequence[str],
    txns: Mapping[str, int],
    app_id_of: Callable[[str, int], str],
) -> CommitOutcome:
    """The upsert of a table only Delta Spark writes: Delta Spark's MERGE, whose commit
    carries one txn action (its idempotent-DML confs take one app id), so one MERGE per
    partition (``merge_per_partition``)."""
    deleting = DELETE_COLUMN in source.schema.names
    return merge_per_partition(
        target,
        committer,
        source,
        schema,
        txns,
        app_id_of,
        rows_of=lambda rows: latest_per_key(rows, merge_keys),
        clauses_of=lambda rows, txn: _clauses(merge_keys, schema.names, deleting, txn),
    )


def merge_per_partition(
    target: DeltaTarget,
    committer: TableCommitter,
    source: pa.Table,
    schema: pa.Schema,
    txns: Mapping[str, int],
    app_id_of: Callable[[str, int], str],
    *,
    rows_of: Callable[[pa.Table], pa.Table],
    clauses_of: Callable[[pa.Table, tuple[str, int]], MergeClauses],
) -> CommitOutcome:
    """Delta Spark MERGEs of ``source`` (of ``schema``'s columns), one per partition, each
    with that partition's rows (above its txn version, then ``rows_of``) and its txn
    (``clauses_of`` spells the MERGE): every partition's rows and its txn version land in
    one commit, as in the batch's single commit elsewhere. A partition whose rows all lie at
    or below its txn version commits its txn alone; a lost race reloads and merges again."""
    pairs = source.select(["topic", "partition"]).to_pylist()
    apps = pa.array([app_id_of(p["topic"], p["partition"]) for p in pairs], pa.string())
    done = MergeDone(-1, 0, 0, 0)
    versions: dict[str, int | None] = {}
    merged = attempts = 0
    for app in sorted(txns):
        for attempt in range(1, target.max_attempts + 1):
            attempts += 1
            table = target.load()
            if table is None:
                raise SinkError(f"{target.uri}: the table is gone")
            current = DeltaTarget.versions_in(table, [app])
            versions[app] = current[app]
            if not newer_txns({app: txns[app]}, current):
                break
            added = schema_changes(table.schema(), schema)
            if added:
                committer.add_columns(target.uri, Schema(added).to_json())
                continue
            rows = rows_of(refilter_rows(source.filter(pc.equal(apps, app)), current, app_id_of))
            result: MergeDone | None
            if rows.num_rows:
                result = committer.merge(target.uri, rows, clauses_of(rows, (app, txns[app])))
            else:
                version = committer.commit(
                    target.uri,
                    [],
                    {app: txns[app]},
                    read_version=table.version(),
                    read_txns=current,
                )
                result = None if version is None else MergeDone(version, 0, 0, 0)
            if result is None:
                target.backoff(attempt)
                continue
            versions[app] = txns[app]
            merged += rows.num_rows
            done = MergeDone(
                max(done.version, result.version),
                done.inserted + result.inserted,
                done.updated + result.updated,
                done.deleted + result.deleted,
            )
            break
        else:
            raise SinkError(f"{target.uri}: no merge after {target.max_attempts} attempts")
    return CommitOutcome(
        None if done.version < 0 else done.version,
        (),
        done.inserted + done.updated,
        versions,
        attempts,
        committed=done.version >= 0,
        dropped_rows=source.num_rows - merged,
        deleted_rows=done.deleted,
    )
