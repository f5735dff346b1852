"""The overwrite's commit (``ingest replay --overwrite``): one transaction that takes every
row the table holds in the batch's offset ranges out and commits the batch's files and
txn actions.

The loop, until the commit lands or gives up (as ``DeltaTarget.commit_files``):

1. Load the table (none yet: create it empty, then go on from it), check that it keeps
   the columns topic, partition and offset, and read the txn versions. They never move
   back, and every partition's txn is written even when its version stays, so a
   concurrent writer of the same partitions conflicts with the replacement instead of
   racing it.
2. Add the batch's new columns first (a commit of their own), then reload.
3. Cut and commit, by one of two writers:

   * **delta-rs**, for tables it writes: ``rewrite.cut_ranges`` lists the files holding
     rows in range, from this attempt's snapshot. A file wholly inside is removed; one
     that mixes is removed and rewritten without them. Those actions, the batch's adds
     and its txns are one commit, guarded against a concurrent rewrite.
   * **Delta Spark's transaction** (``TableCommitter.replace``), for tables with deletion
     vectors (a remove must name its file's vector, which delta-rs cannot) or features
     only Delta Spark writes (row tracking, clustering, in-commit timestamps...:
     ``features.through_delta_spark(table, "overwrite")``). The DELETE of the ranges runs
     inside that transaction as Delta Spark's own DELETE does (deletion vectors where
     the table has them, else rewritten files keeping the other rows' row ids), on the
     snapshot the batch was planned on; the rewrite guard's txn joins it. A table whose
     rows Delta Spark must check or fill has them written by that transaction too.

   A lost race backs off and goes to 1.

A commit that gives up deletes the files it would have added (and the rewritten ones),
unless its outcome is unknown. Files Delta Spark wrote for an attempt that lost its race or
failed before committing (deletion vectors, rewritten files, rows it wrote) are left to
VACUUM, as Delta Spark's own DELETE leaves them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import pyarrow as pa
from deltalake import Schema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from ingest.errors import SinkError, UncommittedError
from ingest.faults import fault_point
from ingest.protocol.partition import Partition
from ingest.sink.delta import CommitOutcome, DeltaTarget
from ingest.sink.files import DataFile
from ingest.sink.maintenance import rewrite
from ingest.sink.metadata.evolution import evolve, mapping_of, nullable_schema, schema_changes
from ingest.sink.metadata.mapping import ColumnMapping
from ingest.sink.txn import REWRITE_GUARD, or_minus_one

__all__ = ["commit_replacing", "range_condition"]

log = logging.getLogger("ingest.sink")

_KEYS = ("topic", "partition", "offset")


def commit_replacing(
    target: DeltaTarget,
    files: Sequence[DataFile],
    txns: Mapping[str, int],
    schema: pa.Schema,
    *,
    ranges: Mapping[Partition, tuple[int, int]],
    mapping: ColumnMapping | None = None,
    rows: pa.Table | None = None,
) -> CommitOutcome:
    """Commits ``files`` and ``txns`` in one transaction that also removes ``target``'s
    rows in ``ranges`` ((topic, partition) -> inclusive first and last offset).
    ``CommitOutcome.dropped_rows`` counts the rows it replaced. ``mapping``: the column
    mapping ``files`` were written with. ``rows``: rows Delta Spark's writer writes in
    that transaction instead of files (a table whose constraints it checks or whose
    generated or identity columns it fills: ``features.rows_through_delta_spark``)."""
    uri = target.uri
    pending = list(files)
    schema = nullable_schema(schema)
    in_doubt = False
    rewritten: list[DataFile] = []
    replaced = removed = 0
    try:
        for attempt in range(1, target.max_attempts + 1):
            table = target.load()
            if table is None:
                target.create_empty(schema)
                continue
            target.check_partitioning(table)
            missing = sorted(set(_KEYS) - {f.name for f in table.schema().fields})
            if missing:
                raise SinkError(
                    f"{uri}: rows can be replaced only in a table that keeps the columns "
                    f"topic, partition and offset; it lacks {missing}"
                )
            current = target.versions_in(table, list(txns))
            # Never back, and always written: a rival of these partitions conflicts.
            wanted = {
                app: max(version, or_minus_one(current[app])) for app, version in txns.items()
            }
            committer = target.committer_for(table, "overwrite")
            if rows is not None and committer is None:
                committer = target.committer
                if committer is None:
                    raise SinkError(f"{uri}: rows Delta Spark writes need the Spark engine")
            if committer is not None:
                added = schema_changes(table.schema(), schema)
                if added:
                    committer.add_columns(uri, Schema(added).to_json())
                    continue  # reload: commit on the evolved snapshot
            try:
                if committer is None and evolve(uri, table, schema):
                    continue  # reload: the cut is taken from the evolved snapshot
            except CommitFailedError:
                target.backoff(attempt)
                continue
            # Files of ours on a table that now wants its rows checked or filled by Delta
            # Spark (a constraint added since planning): the batch is redone.
            rewrite.check_written(uri, table, pending, schema, mapping, appending=rows is None)
            target.check_files(pending)
            if committer is not None:
                # The rewrite guard too: a delta-rs compaction of a table with deletion
                # vectors conflicts with this cut (txn.guard_transaction).
                guard = table.transaction_version(REWRITE_GUARD)
                in_doubt = True
                try:
                    done = committer.replace(
                        uri,
                        [f.add_action() for f in pending],
                        {**wanted, REWRITE_GUARD: or_minus_one(guard) + 1},
                        condition=range_condition(ranges),
                        read_version=table.version(),
                        read_txns={**current, REWRITE_GUARD: guard},
                        rows=rows,
                    )
                except UncommittedError:
                    in_doubt = False
                    raise
                if done is None:
                    in_doubt = False
                    target.backoff(attempt)
                    continue
                version, replaced = done
                break
            removes, rewritten, replaced = rewrite.cut_ranges(
                target.location, table, ranges, attempt, mapping_of(table)
            )
            removed = len(removes)
            actions: list[AddAction | RemoveAction] = [
                *removes,
                *(f.add_action() for f in rewritten),
                *(f.add_action() for f in pending),
            ]
            fault_point("after_overwrite_cut")
            in_doubt = True
            token = target.try_commit(table, actions, wanted, attempt, "replacing", guarded=True)
            if token is None:
                in_doubt = False
                target.location.delete(f.path for f in rewritten)
                rewritten = []
                continue
            version = target.version_of(token)
            break
        else:
            raise SinkError(f"{uri}: no commit after {target.max_attempts} attempts")
    except BaseException:
        if in_doubt:
            log.error(
                "%s: commit outcome unknown; keeping its %d files",
                uri,
                len(pending) + len(rewritten),
            )
        else:
            target.location.delete(f.path for f in [*pending, *rewritten])
        raise
    log.info(
        "%s: replaced %d rows%s with %d rows",
        uri,
        replaced,
        f" in {removed} files" if committer is None else " (Delta Spark)",
        sum(f.rows for f in pending) if rows is None else rows.num_rows,
    )
    outcome = target.committed(version, pending, {**current, **wanted}, attempt, replaced)
    return outcome if rows is None else dataclasses.replace(outcome, rows=rows.num_rows)


def range_condition(ranges: Mapping[Partition, tuple[int, int]]) -> str:
    """Spark SQL that is true for the rows in ``ranges``."""
    return " OR ".join(
        f"(`topic` = {_literal(topic)} AND `partition` = {int(partition)} "
        f"AND `offset` BETWEEN {int(first)} AND {int(last)})"
        for (topic, partition), (first, last) in sorted(ranges.items())
    )


def _literal(text: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
