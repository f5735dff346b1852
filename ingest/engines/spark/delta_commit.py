"""Commits through Delta Spark's own transaction in the driver JVM, for the tables delta-rs
cannot write (row tracking, domain metadata, clustering, in-commit timestamps,
vacuumProtocolCheck, v2 checkpoints: ``ingest.sink.metadata.features``).

The batch's files are written as for any table (pyarrow, the table's column mapping); only
the commit changes. ``DeltaSparkCommitter.commit`` opens an ``OptimisticTransaction`` on the
table (``DeltaLog.startTransaction``, over py4j), reads each partition's txn version through
it (so a concurrent commit of the same app ids conflicts), and commits the add actions with
one ``txn`` action per partition as a ``WRITE`` in append mode. Delta Spark then does what
its own appends do: it assigns ``baseRowId`` and ``defaultRowCommitVersion`` and moves the
row-tracking high-water mark, writes the in-commit timestamp, keeps the clustering domain,
checks the protocol, and writes the checkpoints the table's policy asks for (v2 ones
included) after the commit. Its conflict checks decide a race; a lost one (Delta's
``ConcurrentModificationException`` family) returns None and the caller retries from a new
snapshot. The transaction must read the snapshot the files were planned on: a table that
moved past ``read_version`` is a lost race too.

These are Delta Spark's internal APIs (``DeltaLog``, ``OptimisticTransaction``,
``Action.fromJson``, ``DeltaOperations.Write``): delta-spark is pinned, and
``tests/delta/test_interop.py::test_delta_spark_features`` exercises each one used here.

Each transaction rebuilds its snapshot in a Spark job of ``snapshotPartitions`` tasks, which
ingest's sessions set to 1 (``spark_session.start_session``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
from deltalake.transaction import AddAction

from ingest.engines.spark.catalog import CatalogTables
from ingest.errors import SinkError, UncommittedError
from ingest.sink.txn import MergeClauses, MergeDone, now_ms, or_minus_one

__all__ = ["DeltaSparkCommitter"]

log = logging.getLogger("ingest.sink")

_DELTA = "org.apache.spark.sql.delta"
# Idempotent DML (Delta's SQL confs): the one txn action a MERGE's commit carries.
_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_LAST_COMMIT = "spark.databricks.delta.lastCommitVersionInSession"
# What Delta Spark raises for a lost race (all its Concurrent*Exception classes).
_LOST_RACE = "java.util.ConcurrentModificationException"


P = ParamSpec("P")
R = TypeVar("R")


def _keeps_active_session(
    method: Callable[Concatenate[DeltaSparkCommitter, P], R],
) -> Callable[Concatenate[DeltaSparkCommitter, P], R]:
    """Gives the calling thread its active Spark session back afterwards: the committer makes
    its own sessions active (Delta reads the thread's), and a caller's later Delta statements
    on this thread must not run under them (measured: Delta Spark then fails its commit on
    metrics its session never registered)."""

    def keeping(self: DeltaSparkCommitter, /, *args: P.args, **kwargs: P.kwargs) -> R:
        spark = self.jvm.org.apache.spark.sql.SparkSession
        before = spark.getActiveSession()
        try:
            return method(self, *args, **kwargs)
        finally:
            if before.isDefined():
                spark.setActiveSession(before.get())
            else:
                spark.clearActiveSession()

    keeping.__name__, keeping.__doc__ = method.__name__, method.__doc__
    return keeping


class DeltaSparkCommitter:
    """``ingest.sink.txn.TableCommitter`` on a live Spark session with Delta's jars."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.jvm = session._jvm
        self._merges: Any | None = None

    @_keeps_active_session
    def create_table(
        self,
        name: str,
        uri: str,
        schema_json: str,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        CatalogTables(self.session).create(name, uri, schema_json, partition_by, properties)

    @_keeps_active_session
    def commit(
        self,
        uri: str,
        adds: Sequence[AddAction],
        txns: Mapping[str, int],
        *,
        read_version: int,
        read_txns: Mapping[str, int | None],
    ) -> int | None:
        from py4j.protocol import Py4JJavaError

        session = self._session_for(uri)
        try:
            delta_log = self.jvm.org.apache.spark.sql.delta.DeltaLog.forTable(session, uri)
            txn = delta_log.startTransaction()
            if not self._as_planned(uri, txn, read_version, txns, read_txns):
                return None
            version: int = txn.commit(self._seq(_actions(adds, txns)), self._write("Append"))
        except Py4JJavaError as exc:
            if self._lost_race(exc):
                log.info("%s: a Delta Spark commit lost a race: %s", uri, _message(exc))
                return None
            raise SinkError(f"{uri}: Delta Spark's commit failed: {_message(exc)}") from None
        return version

    @_keeps_active_session
    def replace(
        self,
        uri: str,
        adds: Sequence[AddAction],
        txns: Mapping[str, int],
        *,
        condition: str,
        read_version: int,
        read_txns: Mapping[str, int | None],
        rows: pa.Table | None = None,
    ) -> tuple[int, int] | None:
        """Delta Spark's DELETE of ``condition`` (``DeleteCommand``, as analysed from the
        statement) run inside this transaction (``performDelete``): it finds the files
        holding matching rows through the transaction (so a concurrent change of them
        conflicts), and marks those rows deleted in deletion vectors where the table has
        them, else rewrites each such file without them, keeping the other rows' row ids
        and commit versions (row tracking). ``rows`` are written by the transaction's own
        ``writeFiles``, as Delta Spark's writes do: it fills generated and identity columns
        and fails on a row that breaks a constraint (the caller made those dead letters).
        Its actions, ``adds`` and ``txns`` are then one commit: a WRITE in overwrite mode
        whose predicate is ``condition``."""
        from py4j.protocol import Py4JJavaError

        # A session of its own: Delta's DELETE reads the session's idempotent-write confs
        # (txnAppId), which a session ingest joined may hold.
        self._check_log_store(uri)
        own = self._merge_session()
        session = own._jsparkSession
        state = session.sessionState()
        statement = f"DELETE FROM delta.{_quoted(uri)} WHERE {condition}"
        converters = self.jvm.scala.jdk.javaapi.CollectionConverters
        try:
            skip = self.jvm.org.apache.spark.sql.execution.CommandExecutionMode.SKIP()
            delete = state.executePlan(state.sqlParser().parsePlan(statement), skip).analyzed()
            if delete.getClass().getName() != f"{_DELTA}.commands.DeleteCommand":
                raise UncommittedError(
                    f"{uri}: Delta Spark planned {delete.getClass().getName()} for the "
                    "overwrite's DELETE, not its DeleteCommand"
                )
            delta_log = delete.deltaLog()
            txn = delta_log.startTransaction()
            if not self._as_planned(uri, txn, read_version, txns, read_txns):
                return None
            removed = converters.asJava(delete.performDelete(session, delta_log, txn)._1())
            changes = int(delete.metrics().apply("numAddedChangeFiles").value()) > 0
            if changes and adds:
                # land.py hands such a batch's rows over (cut_writes_change_data).
                raise UncommittedError(
                    f"{uri}: Delta Spark's DELETE wrote change data files, and ingest's own "
                    "files carry none: the change feed would miss the replayed rows"
                )
            deleted = int(delete.metrics().apply("numDeletedRows").value())
            listed = self.jvm.java.util.ArrayList(removed)
            if rows is not None and rows.num_rows:
                frame = _cast_to(own.createDataFrame(rows), txn.metadata().schema().json())
                if changes:  # a commit with change data files is read from them alone
                    frame = self._with_insert_changes(frame, txn)
                listed.addAll(converters.asJava(txn.writeFiles(frame._jdf)))
            listed.addAll(converters.asJava(self._seq(_actions(adds, txns))))
            # As DeleteCommand's own commit: row ids kept (a table with row tracking).
            tracking = getattr(getattr(getattr(self.jvm, _DELTA), "RowTracking$"), "MODULE$")
            tags = tracking.addPreservedRowTrackingTagIfNotSet(
                txn.snapshot(), self.jvm.scala.Predef.Map().empty()
            )
        except Py4JJavaError as exc:  # nothing committed yet
            if self._lost_race(exc):
                log.info("%s: a Delta Spark overwrite lost a race: %s", uri, _message(exc))
                return None
            raise UncommittedError(
                f"{uri}: Delta Spark's overwrite failed: {_message(exc)}"
            ) from None
        try:
            operation = self._write("Overwrite", condition)
            version: int = txn.commit(converters.asScala(listed).toSeq(), operation, tags)
        except Py4JJavaError as exc:
            if self._lost_race(exc):
                log.info("%s: a Delta Spark overwrite lost a race: %s", uri, _message(exc))
                return None
            raise SinkError(
                f"{uri}: Delta Spark's overwrite commit failed: {_message(exc)}"
            ) from None
        log.info("%s: Delta Spark's DELETE took %d rows out of the range", uri, deleted)
        return version, deleted

    def _with_insert_changes(self, frame: Any, txn: Any) -> Any:
        """``frame`` twice over, as Delta Spark's replaceWhere writes a change feed's
        inserts: each row once as data and once as an ``insert`` change (``_change_type``
        set: ``writeFiles`` puts it in a change data file). Identity values are drawn
        first, so both copies of a row carry the same one."""
        from pyspark.sql import Column
        from pyspark.sql.functions import array, col, explode, lit, struct

        delta = getattr(self.jvm, _DELTA)
        identity = getattr(getattr(delta, "IdentityColumn$"), "MODULE$")
        defaults = getattr(getattr(delta, "ColumnWithDefaultExprUtils$"), "MODULE$")
        present = {c.lower() for c in frame.columns}
        fields = txn.metadata().schema().fields()
        drawn = [
            f for f in fields if defaults.isIdentityColumn(f) and f.name().lower() not in present
        ]
        if drawn:
            names = self.jvm.scala.jdk.javaapi.CollectionConverters.asScala(
                self.jvm.java.util.HashSet([f.name() for f in drawn])
            ).toSet()
            txn.setTrackHighWaterMarks(names)
            frame = frame.select(
                *(col(_quoted(c)) for c in frame.columns),
                *(Column(identity.createIdentityColumnGenerationExprAsColumn(f)) for f in drawn),
            )
        columns = [col(_quoted(c)) for c in frame.columns]
        change = "_change_type"
        packed = explode(
            array(
                struct(*columns, lit("insert").alias(change)),
                struct(*columns, lit(None).cast("string").alias(change)),
            )
        )
        return frame.select(packed.alias("packed")).select(
            *(col(f"packed.{_quoted(c)}").alias(c) for c in [*frame.columns, change])
        )

    def _session_for(self, uri: str) -> Any:
        """The session's JVM side, made the thread's active one: Delta reads the thread's
        active session (this thread is the supervisor's, not one Spark started)."""
        self._check_log_store(uri)
        session = self.session._jsparkSession
        self.jvm.org.apache.spark.sql.SparkSession.setActiveSession(session)
        return session

    @staticmethod
    def _as_planned(
        uri: str,
        txn: Any,
        read_version: int,
        txns: Mapping[str, int],
        read_txns: Mapping[str, int | None],
    ) -> bool:
        """Whether ``txn`` reads the snapshot the batch was planned on: its version, and the
        txn versions of the batch's app ids (read through ``txn``, so a concurrent commit of
        the same app ids conflicts)."""
        if txn.readVersion() != read_version:
            log.info(
                "%s: the table moved to version %d since version %d was planned on",
                uri,
                txn.readVersion(),
                read_version,
            )
            return False
        for app in sorted(txns):
            if txn.txnVersion(app) != or_minus_one(read_txns.get(app)):
                log.info("%s: txn %s moved since the batch was planned", uri, app)
                return False
        return True

    @_keeps_active_session
    def merge(self, uri: str, rows: pa.Table, clauses: MergeClauses) -> MergeDone | None:
        from delta.exceptions import DeltaConcurrentModificationException
        from delta.tables import DeltaTable

        self._check_log_store(uri)
        session = self._merge_session()
        app, version = clauses.txn
        session.conf.set(_TXN_APP_ID, app)
        session.conf.set(_TXN_VERSION, str(version))
        session.conf.unset(_LAST_COMMIT)
        try:
            source = session.createDataFrame(rows)
            values: dict[str, Any] = {c: f"s.{_quoted(c)}" for c in clauses.columns}
            merger = (
                DeltaTable.forPath(session, uri).alias("t").merge(source.alias("s"), clauses.on)
            )
            if clauses.delete_when is not None:
                merger = merger.whenMatchedDelete(clauses.delete_when)
            if clauses.update_when is not None:
                merger = merger.whenMatchedUpdate(clauses.update_when, set=values)
            merger = merger.whenNotMatchedInsert(clauses.insert_when or "true", values=values)
            done = merger.execute().collect()
            committed = session.conf.get(_LAST_COMMIT, None)
        except DeltaConcurrentModificationException as exc:
            log.info("%s: a Delta Spark MERGE lost a race: %s", uri, str(exc).splitlines()[0])
            return None
        except Exception as exc:  # pyspark's captured JVM errors
            raise SinkError(f"{uri}: Delta Spark's MERGE failed: {exc}") from None
        finally:
            session.conf.unset(_TXN_APP_ID)
            session.conf.unset(_TXN_VERSION)
        if committed is None:
            # No commit: Delta skipped the MERGE, whose txn version a rival's commit of the
            # same partition reached first (idempotent DML); the caller reloads.
            log.info("%s: txn %s reached %d by another commit first", uri, app, version)
            return None
        metrics = done[0].asDict() if done else {}
        return MergeDone(
            int(committed),
            int(metrics.get("num_inserted_rows", 0)),
            int(metrics.get("num_updated_rows", 0)),
            int(metrics.get("num_deleted_rows", 0)),
        )

    @_keeps_active_session
    def failing(self, rows: pa.Table, checks: Sequence[tuple[str, str]]) -> list[str | None]:
        if not checks or rows.num_rows == 0:
            return [None] * rows.num_rows
        session = self._merge_session()
        numbered = rows.append_column("__ingest_row", pa.array(range(rows.num_rows), pa.int64()))
        frame = session.createDataFrame(numbered)
        # The index of the first check a row fails, null when it passes them all.
        first = (
            "CASE "
            + " ".join(
                f"WHEN NOT coalesce(({expr}), false) THEN {n}" for n, (_, expr) in enumerate(checks)
            )
            + " END"
        )
        try:
            failed = (
                frame.selectExpr("__ingest_row", f"{first} AS failed")
                .where("failed IS NOT NULL")
                .collect()
            )
        except Exception as exc:  # an expression Spark cannot evaluate on these rows
            raise SinkError(f"cannot check the table's constraints on the batch: {exc}") from None
        labels: list[str | None] = [None] * rows.num_rows
        for row in failed:
            labels[int(row["__ingest_row"])] = checks[int(row["failed"])][0]
        return labels

    def _merge_session(self) -> Any:
        """A session of its own for MERGEs and overwrites: the txn confs a MERGE takes are
        the session's, and ``lastCommitVersionInSession`` then names this MERGE's commit."""
        if self._merges is None:
            self._merges = self.session.newSession()
        self.jvm.org.apache.spark.sql.SparkSession.setActiveSession(self._merges._jsparkSession)
        return self._merges

    @_keeps_active_session
    def add_columns(self, uri: str, schema_json: str) -> None:
        self._check_log_store(uri)
        struct = self.jvm.org.apache.spark.sql.types.DataType.fromJson(schema_json)
        names = list(struct.fieldNames())
        log.info("%s: adding columns %s through Delta Spark", uri, names)
        self.jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.session._jsparkSession)
        path = uri.replace("`", "``")
        try:
            self.session.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({struct.toDDL()})")
        except Exception as exc:  # pyspark's captured JVM errors
            text = str(exc)
            # A rival added them, or changed the table meanwhile: the caller reloads and
            # finds the columns there (or adds what is still missing).
            if "already exists" in text or "Concurrent" in text or "MetadataChanged" in text:
                log.info("%s: adding columns %s lost a race: %s", uri, names, text[:200])
                return
            raise SinkError(f"{uri}: Delta Spark could not add columns {names}: {exc}") from None

    def _check_log_store(self, uri: str) -> None:
        """Refuses a commit to S3 through Delta Spark's default S3 log store, which makes a
        commit file with a plain PUT: a second writer (another host's Delta Spark, or
        delta-rs, which coordinates by conditional writes only) committing the same version
        would overwrite it, and the rows whose offsets ingest then commits to Kafka would be
        lost. A session that names its own S3 log store has chosen."""
        if urlsplit(uri).scheme.lower() not in ("s3", "s3a"):
            return
        keys = ("spark.delta.logStore.s3a.impl", "spark.delta.logStore.s3.impl")
        if any(self.session.conf.get(key, None) for key in (*keys, "spark.delta.logStore.class")):
            return
        raise SinkError(
            f"{uri}: this table's features need Delta Spark's commits, and Delta Spark 4.4 "
            "commits to S3 with a plain PUT (S3SingleDriverLogStore), which does not stop a "
            "second writer of the same version; delta-rs, ingest's other writer, coordinates "
            "by conditional writes only (upstream limits). Set spark.delta.logStore.s3a.impl "
            "(e.g. io.delta.storage.S3DynamoDBLogStore, with every writer of the table on it) "
            "in [spark] conf to take this on"
        )

    def _seq(self, actions: Sequence[str]) -> Any:
        listed = self.jvm.java.util.ArrayList()
        parse = getattr(self.jvm, _DELTA).actions.Action.fromJson
        for action in actions:
            listed.add(parse(action))
        return self.jvm.scala.jdk.javaapi.CollectionConverters.asScala(listed).toSeq()

    def _write(self, mode: str, predicate: str | None = None) -> Any:
        """``DeltaOperations.Write(SaveMode.<mode>, predicate)``: DESCRIBE HISTORY's WRITE."""
        none = self.jvm.scala.Option.empty()
        where = none if predicate is None else self.jvm.scala.Some(predicate)
        write = getattr(getattr(self.jvm, _DELTA), "DeltaOperations$Write")
        save_mode = getattr(self.jvm.org.apache.spark.sql.SaveMode, mode)
        return write(save_mode, none, where, *[none] * 6)

    def _lost_race(self, exc: Any) -> bool:
        lost = self.jvm.java.lang.Class.forName(_LOST_RACE)
        return bool(lost.isInstance(exc.java_exception))


def _cast_to(frame: Any, schema_json: str) -> Any:
    """``frame``'s columns cast to the table's types (``schema_json``, its logical schema),
    as a MERGE's insert casts: ``writeFiles`` writes the types it is given."""
    from pyspark.sql.functions import col
    from pyspark.sql.types import StructType

    table = {f.name.lower(): f.dataType for f in StructType.fromJson(json.loads(schema_json))}
    return frame.select(
        *(
            col(_quoted(name)).cast(table[name.lower()]).alias(name)
            if name.lower() in table
            else col(_quoted(name))
            for name in frame.columns
        )
    )


def _actions(adds: Sequence[AddAction], txns: Mapping[str, int]) -> list[str]:
    """The add actions, then one txn action per app id, as Delta's JSON."""
    return [_add_json(add) for add in adds] + [
        json.dumps({"txn": {"appId": app, "version": version, "lastUpdated": now_ms()}})
        for app, version in sorted(txns.items())
    ]


def _add_json(add: AddAction) -> str:
    return json.dumps(
        {
            "add": {
                "path": add.path,
                "partitionValues": dict(add.partition_values),
                "size": add.size,
                "modificationTime": add.modification_time,
                "dataChange": add.data_change,
                "stats": add.stats,
            }
        }
    )


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _message(exc: Any) -> str:
    java = getattr(exc, "java_exception", None)
    return str(java.getMessage() if java is not None else exc).splitlines()[0]
