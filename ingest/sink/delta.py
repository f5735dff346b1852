"""One Delta table seen by the driver: txn versions, and the one commit per batch.

``DeltaTarget.commit_files`` commits files written elsewhere (by Spark tasks,
with pyarrow) in ONE delta-rs transaction together with one ``txn`` action per
source partition. The loop it runs, until the commit lands or gives up:

1. Load the table (none yet: it will be created by this very commit, with the
   batch's schema and partition columns).
2. Read the txn version of every app id of the batch. Where a version moved
   past what the batch was filtered with (a concurrent writer of the same
   partitions won a race), re-filter: drop the files whose rows are all covered
   now, rewrite the ones that are partly covered (deleting the old file;
   ``rewrite.without_covered``). A file that does not say which offsets it holds
   cannot be re-filtered: ``StaleBatchError`` tells the caller to redo the batch.
3. Keep only txn versions above the table's (never move a version back). With
   no file and no txn left, the batch is already durable: nothing is committed.
4. Check that every file exists with its size (delta-rs does not), commit, adding the
   batch's new columns to the schema in the same commit (``evolution.py``). A table
   delta-rs cannot write (row tracking, clustering...) commits through the batch's
   ``TableCommitter`` instead: Delta Spark's transaction (``features.through_delta_spark``).
5. ``CommitFailedError`` (a concurrent transaction conflicted, e.g. one that
   wrote the same app ids) or a lost creation race: back off and go to 1.

The overwrite form (``ingest replay --overwrite``) is ``overwrite.commit_replacing``.

A commit that gives up deletes the files it would have added (no orphans); a commit's
version is found by the token its commitInfo carries (``ingest.commit``).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from ingest.errors import SinkError
from ingest.faults import fault_point
from ingest.sink.files import DataFile
from ingest.sink.maintenance import rewrite
from ingest.sink.metadata.evolution import (
    evolve,
    mapping_of,
    nullable_schema,
    schema_changes,
    widening,
)
from ingest.sink.metadata.features import Use, committed_by_delta_spark, through_delta_spark
from ingest.sink.metadata.mapping import ColumnMapping
from ingest.sink.storage import TableLocation
from ingest.sink.txn import (
    COMMIT_TOKEN_KEY,
    TableCommitter,
    commit_properties,
    newer_txns,
)
from ingest.sink.txnlog import SNAPSHOTS

__all__ = ["CommitOutcome", "DeltaTarget"]

log = logging.getLogger("ingest.sink")


@dataclass(frozen=True)
class CommitOutcome:
    """What a commit did: the table version holding the batch (None when nothing
    needed committing and the table does not exist), the files and rows it
    added, and the txn version of every app id afterwards."""

    version: int | None
    files: tuple[DataFile, ...]
    rows: int
    txn_versions: Mapping[str, int | None]
    attempts: int
    committed: bool
    dropped_rows: int = 0
    deleted_rows: int = 0  # rows of the table a merge deleted
    stage_seconds: Mapping[str, float] = field(default_factory=dict)


# What a table ingest creates gets unless [table] properties say otherwise. A checkpoint
# every 10 versions, as Delta Spark's default (delta-rs's is 100): a first load reads the
# last checkpoint, and every commit file after it is one more read, on a thread of delta-rs's
# pool (a continuous run at 100 commit files past a checkpoint held ~100 threads). Later
# batches read only the commits since (``txnlog.Snapshots``).
CREATED_TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}


class DeltaTarget:
    """One Delta table the driver commits to."""

    def __init__(
        self,
        location: TableLocation,
        *,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        max_attempts: int = 20,
        backoff_seconds: float = 0.05,
        max_backoff_seconds: float = 2.0,
        committer: TableCommitter | None = None,
        name: str | None = None,
    ) -> None:
        self.location = location
        # Its name in Spark's catalog, if the config names it: created through the catalog.
        self.name = name
        # Commits for a table delta-rs cannot write (Delta Spark's transaction), if any.
        self.committer = committer
        self.partition_by = tuple(partition_by)
        # The table properties (``delta.*`` configuration) a table created here gets.
        self.properties = {**CREATED_TABLE_PROPERTIES, **dict(properties or {})}
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._table: DeltaTable | None = None  # the snapshot ``load`` keeps up to date

    def __repr__(self) -> str:
        return f"DeltaTarget({self.location.uri!r})"

    @property
    def uri(self) -> str:
        return self.location.uri

    def load(self) -> DeltaTable | None:
        """The table's latest snapshot (None: no table yet). The target keeps it and brings
        it up to date at each load by reading only the commits made since; its first load
        takes the one an earlier target of the table gave back (``release``), if any."""
        if self._table is None:
            self._table = SNAPSHOTS.take(self.location)
        if self._table is not None:
            try:
                self._table.update_incremental()
                return self._table
            except DeltaError as exc:
                log.info("%s: reloading the table: %s", self.uri, exc)
                self._table = None
        try:
            self._table = DeltaTable(self.uri, storage_options=self.location.delta_options())
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            raise SinkError(f"{self.uri}: cannot load the table: {exc}") from exc
        return self._table

    def release(self) -> None:
        """Gives the snapshot this target holds to the table's next target (after a
        landing that went through; one that failed drops it)."""
        if self._table is not None:
            SNAPSHOTS.give(self.location, self._table)
            self._table = None

    @staticmethod
    def versions_in(table: DeltaTable | None, app_ids: Sequence[str]) -> dict[str, int | None]:
        if table is None:
            return dict.fromkeys(app_ids)
        return {app: table.transaction_version(app) for app in app_ids}

    def versions(self, app_ids: Sequence[str]) -> dict[str, int | None]:
        try:
            return self.versions_in(self.load(), app_ids)
        finally:
            self.release()

    def check_partitioning(self, table: DeltaTable | None) -> None:
        if table is None:
            return
        existing = tuple(table.metadata().partition_columns)
        if existing != self.partition_by:
            raise SinkError(
                f"{self.uri} is partitioned by {list(existing)}, the configuration says "
                f"{list(self.partition_by)}"
            )

    def create_empty(self, schema: pa.Schema) -> None:
        """Creates the table with no data and no txn, its partitioning and its
        ``properties``, or finds it created by a rival (whose properties it keeps).

        Data never rides in the creating commit: when two writers create the same table
        at once, delta-rs rebases the loser's create onto the winner's without checking
        txn actions (both creates "succeed"), which would land the same offsets twice.
        With no retries the loser is refused instead, and both then commit their data
        through create_write_transaction, whose conflict check sees the txn actions.
        A table by ``name`` is created and registered through Spark's catalog."""
        if self.name is not None:
            if self.committer is None:
                raise SinkError(f"{self.name}: a table by name is created through Spark's catalog")
            self.committer.create_table(
                self.name,
                self.uri,
                Schema.from_arrow(schema).to_json(),
                self.partition_by,
                self.properties,
            )
            return
        try:
            create_table_with_add_actions(
                self.uri,
                Schema.from_arrow(schema),
                [],
                mode="error",
                partition_by=list(self.partition_by) or None,
                configuration=self.properties or None,
                storage_options=self.location.delta_options(),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError:
            log.info("%s: another writer created the table first", self.uri)
        except DeltaError as exc:
            if "already exists" not in str(exc):
                raise SinkError(f"{self.uri}: cannot create the table: {exc}") from exc
            log.info("%s: another writer created the table first", self.uri)

    def commit_files(
        self,
        files: Sequence[DataFile],
        txns: Mapping[str, int],
        schema: pa.Schema,
        *,
        planned: Mapping[str, int | None],
        app_id_of: Callable[[str, int], str],
        mapping: ColumnMapping | None = None,
    ) -> CommitOutcome:
        """Commits ``files`` with ``txns`` (app id -> last offset) in one transaction.

        ``planned`` are the txn versions the files were filtered with; ``app_id_of``
        maps a file's (topic, partition) to its app id; ``mapping``: the column mapping
        they were written with (a table's new or renamed columns make the batch stale)."""
        pending = list(files)
        dropped = 0
        schema = nullable_schema(schema)
        # Set while a commit's outcome is unknown: its files must then stay.
        in_doubt = False
        try:
            for attempt in range(1, self.max_attempts + 1):
                table = self.load()
                self.check_partitioning(table)
                current = self.versions_in(table, list(txns))
                pending, lost = rewrite.refilter(
                    self.location, pending, planned, current, app_id_of, attempt, mapping
                )
                fault_point("after_snapshot_load")
                dropped += lost
                wanted = newer_txns(txns, current)
                if not pending and not wanted:
                    return CommitOutcome(
                        version=None if table is None else table.version(),
                        files=(),
                        rows=0,
                        txn_versions=current,
                        attempts=attempt,
                        committed=False,
                        dropped_rows=dropped,
                    )
                self.check_files(pending)
                if table is None:
                    self.create_empty(schema)
                    continue  # reload: the data goes through the conflict-checked path
                added = schema_changes(table.schema(), schema)
                mapped = mapping_of(table)
                committer = self.committer_for(table)
                if added and committer is not None:
                    committer.add_columns(self.uri, Schema(added).to_json())
                    continue  # reload: commit on the evolved snapshot
                if added and mapped is not None:
                    try:
                        evolve(self.uri, table, schema)
                    except CommitFailedError:
                        self.backoff(attempt)
                    continue  # reload: commit on the evolved snapshot
                rewrite.check_written(self.uri, table, pending, schema, mapping, appending=True)
                in_doubt = True
                adds = [f.add_action() for f in pending]
                if committer is not None:
                    version = committer.commit(
                        self.uri, adds, wanted, read_version=table.version(), read_txns=current
                    )
                    if version is None:
                        self.backoff(attempt)
                else:
                    token = self.try_commit(table, adds, wanted, attempt, "commit", added)
                    version = None if token is None else self.version_of(token)
                if version is None:
                    in_doubt = False
                    continue
                break
            else:
                raise SinkError(f"{self.uri}: no commit after {self.max_attempts} attempts")
        except BaseException:
            if in_doubt:
                log.error(
                    "%s: commit outcome unknown; keeping its %d files", self.uri, len(pending)
                )
            else:
                self.location.delete(f.path for f in pending)
            raise
        return self.committed(version, pending, {**current, **wanted}, attempt, dropped)

    def committed(
        self,
        version: int,
        files: Sequence[DataFile],
        txn_versions: Mapping[str, int | None],
        attempts: int,
        dropped_rows: int,
    ) -> CommitOutcome:
        """The outcome of a commit that went through, as ``version``."""
        return CommitOutcome(
            version=version,
            files=tuple(files),
            rows=sum(f.rows for f in files),
            txn_versions=txn_versions,
            attempts=attempts,
            committed=True,
            dropped_rows=dropped_rows,
        )

    def try_commit(
        self,
        table: DeltaTable,
        actions: Sequence[AddAction | RemoveAction],
        txns: Mapping[str, int],
        attempt: int,
        what: str,
        added: Sequence[Field] = (),
        *,
        guarded: bool = False,
        read: bool = False,
    ) -> str | None:
        """One commit of ``actions`` and ``txns``: the token it carries (find its version
        with ``version_of``), or None when a concurrent commit won (after the backoff).
        ``added``: columns the commit adds to the schema. ``guarded``: it removes files of
        ``table``, so it carries the rewrite guard. ``read``: the actions follow from rows the
        commit read (a MERGE's), so it is no blind append even when it only adds."""
        token = uuid.uuid4().hex
        properties = commit_properties(
            token, txns, guarded=table if guarded else None, actions=actions, read=read
        )
        how = widening(table, list(added))
        if added:
            log.info("%s: adding columns %s", self.uri, [f.name for f in added])
        try:
            table.create_write_transaction(
                list(actions),
                how.mode,
                how.schema,
                partition_by=list(self.partition_by) or None,
                partition_filters=how.partition_filters,
                commit_properties=properties,
            )
        except CommitFailedError as exc:
            log.info("%s: %s attempt %d lost a race: %s", self.uri, what, attempt, exc)
            self.backoff(attempt)
            return None
        except DeltaError as exc:
            raise SinkError(f"{self.uri}: commit failed: {exc}") from exc
        return token

    def commit_txns(self, txns: Mapping[str, int], schema: pa.Schema) -> CommitOutcome:
        """A commit holding only txn actions (e.g. after a merge that changed nothing)."""
        return self.commit_files(
            [], txns, schema, planned=dict.fromkeys(txns), app_id_of=lambda t, p: ""
        )

    def backoff(self, attempt: int) -> None:
        """Waits before attempt ``attempt + 1`` (exponential, jittered, capped)."""
        ceiling = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1))
        time.sleep(random.uniform(ceiling / 2, ceiling))

    def version_of(self, token: str) -> int:
        """The version of the commit that carries ``token``."""
        table = self.load()
        assert table is not None
        for limit in (3, 50):  # ours is the latest commit, mostly
            for entry in table.history(limit=limit):
                if entry.get(COMMIT_TOKEN_KEY) == token:
                    return int(entry["version"])
        raise SinkError(f"{self.uri}: committed, but the commit is not in the last 50 versions")

    def committer_for(self, table: DeltaTable, use: Use = "append") -> TableCommitter | None:
        """Delta Spark for a table delta-rs cannot write (``use`` "append": commits of files
        and txns; "upsert": MERGEs), else None."""
        features = (
            through_delta_spark(table, use) if use != "append" else committed_by_delta_spark(table)
        )
        if not features:
            return None
        if self.committer is None:  # check_table refused it before the batch, mostly
            raise SinkError(f"{self.uri}: {features} need the Spark engine")
        return self.committer

    def check_files(self, files: Sequence[DataFile]) -> None:
        if not files:
            return
        sizes = self.location.sizes(f.path for f in files)
        wrong = [
            f"{f.path} ({'missing' if sizes[f.path] is None else f'{sizes[f.path]} bytes'}, "
            f"expected {f.size})"
            for f in files
            if sizes[f.path] != f.size
        ]
        if wrong:
            raise SinkError(f"{self.uri}: data files to commit are not as written: {wrong}")
