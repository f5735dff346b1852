"""Delta Spark's OPTIMIZE and VACUUM, for the tables ingest commits to through Delta Spark's
transaction (``ingest.sink.metadata.features.committed_by_delta_spark``): ingest's own
compaction writes with pyarrow and commits with delta-rs, which such a table refuses, and
Delta Spark keeps what those features ask of a rewrite (row ids and their commit versions,
deletion vectors purged into the new files, the clustering: OPTIMIZE clusters a clustered
table, in-commit timestamps, v2 checkpoints).

``SparkTableMaintenance`` is ``ingest.sink.maintenance.maintain.DeltaSparkMaintenance`` on
a session of its own beside the Spark engine's (the same SparkContext and executors, its
own SQL confs: the engine's runtime confs copied, OPTIMIZE's file size and the listing's
parallelism set). A maintenance pass calls it from its own thread while batches may land:
OPTIMIZE conflicts with no blind append (Delta's WriteSerializable isolation); one that
loses a race (to another member's OPTIMIZE, or a MERGE) commits nothing and reports it, as
ingest's own compaction does. Its jobs share the executors in Spark's scheduler order, so
a batch's job may wait for an OPTIMIZE's tasks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ingest.errors import SinkError
from ingest.sink.maintenance.compact import Compaction
from ingest.sink.storage import TableLocation

__all__ = ["SparkTableMaintenance"]

log = logging.getLogger("ingest.sink")

_LAST_COMMIT = "spark.databricks.delta.lastCommitVersionInSession"
_MAX_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
# What Delta Spark raises for a lost race (all its Concurrent*Exception classes).
_LOST_RACE = "java.util.ConcurrentModificationException"


class _LostRace(Exception):
    pass


class SparkTableMaintenance:
    """OPTIMIZE and VACUUM by Delta Spark, on a session made from ``session`` (one per
    engine: ``SparkEngine.table_maintenance``)."""

    def __init__(self, session: Any) -> None:
        self.session = session.newSession()
        own = self.session.conf.getAll
        for key, value in session.conf.getAll.items():  # e.g. secrets handed over at runtime
            if own.get(key) != value and session.conf.isModifiable(key):
                self.session.conf.set(key, value)
        # VACUUM lists the table in as many tasks as partition discovery's parallelism,
        # 10,000 by default (measured: 53 s for a table of a few files on local[2], 10 s
        # at 2 tasks): twice the cores here.
        tasks = str(max(2, 2 * int(session.sparkContext.defaultParallelism)))
        self.session.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", tasks)
        self.session.conf.set("spark.sql.shuffle.partitions", tasks)

    def optimize(self, location: TableLocation, target_file_size: int) -> Compaction:
        """``OPTIMIZE`` into files of up to ``target_file_size`` (``maxFileSize``): its
        metrics, its commit's version, and the rows of the files that commit added (Delta
        Spark's metrics do not count rows)."""
        self.session.conf.set(_MAX_FILE_SIZE, str(target_file_size))
        self.session.conf.unset(_LAST_COMMIT)
        try:
            rows = self._sql(location, "OPTIMIZE {table}")
        except _LostRace as lost:
            log.info("%s: Delta Spark's OPTIMIZE lost a race: %s", location.uri, lost)
            return Compaction(None, 0, 0, 0, 0, lost_race=True)
        metrics = rows[0]["metrics"] if rows else None
        if metrics is None:
            return Compaction(None, 0, 0, 0, 0)
        removed, added = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
        read = int(metrics["filesRemoved"]["totalSize"] or 0)
        committed = self.session.conf.get(_LAST_COMMIT, None)
        if (not removed and not added) or committed is None:
            return Compaction(None, 0, 0, 0, read)
        version = int(committed)
        log.info(
            "%s: Delta Spark's OPTIMIZE replaced %d files with %d (version %d)",
            location.uri,
            removed,
            added,
            version,
        )
        return Compaction(version, removed, added, _added_records(location, version), read)

    def vacuum(self, location: TableLocation, *, full: bool) -> tuple[str, ...]:
        """``VACUUM`` by the table's own retention (Delta Spark 4.4 ignores a ``RETAIN``
        other than 0 hours: ``DELTA_VACUUM_RETENTION_WINDOW_IGNORE_ENABLED``), ``LITE``
        unless ``full`` (only files the log removed); the paths it deleted, as its DRY RUN
        listed them just before."""
        mode = "" if full else " LITE"
        try:
            listed = self._sql(location, f"VACUUM {{table}}{mode} DRY RUN")
            if not listed:
                return ()
            self._sql(location, f"VACUUM {{table}}{mode}")
        except _LostRace as lost:  # VACUUM commits its start and end when logging is on
            log.info("%s: Delta Spark's VACUUM lost a race: %s", location.uri, lost)
            return ()
        return tuple(sorted(str(row["path"]) for row in listed))

    def _sql(self, location: TableLocation, statement: str) -> list[Any]:
        table = "delta.`" + location.uri.replace("`", "``") + "`"
        text = statement.format(table=table)
        with self._active():
            try:
                return list(self.session.sql(text).collect())
            except Exception as exc:  # pyspark's captured JVM errors, or py4j's
                origin = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
                jvm = self.session._jvm
                lost = jvm.java.lang.Class.forName(_LOST_RACE)
                message = str(origin.getMessage() if origin is not None else exc)
                first = (message.splitlines() or [type(exc).__name__])[0]
                if origin is not None and lost.isInstance(origin):
                    raise _LostRace(first) from exc
                raise SinkError(
                    f"{location.uri}: Delta Spark's {text.split()[0]} failed: {first}"
                ) from exc

    @contextmanager
    def _active(self) -> Iterator[None]:
        """This session as the thread's active one (Delta reads the thread's), and the
        thread's own back afterwards."""
        spark = self.session._jvm.org.apache.spark.sql.SparkSession
        before = spark.getActiveSession()
        spark.setActiveSession(self.session._jsparkSession)
        try:
            yield
        finally:
            if before.isDefined():
                spark.setActiveSession(before.get())
            else:
                spark.clearActiveSession()


def _added_records(location: TableLocation, version: int) -> int:
    """The rows of the files commit ``version`` added (their stats' ``numRecords``)."""
    filesystem, root = location.filesystem()
    path = f"{root.rstrip('/')}/_delta_log/{version:020d}.json"
    with filesystem.open_input_stream(path) as stream:
        lines = stream.read().decode().splitlines()
    total = 0
    for line in lines:
        add = json.loads(line).get("add") if line.strip() else None
        if add and add.get("stats"):
            total += int(json.loads(add["stats"]).get("numRecords", 0))
    return total
