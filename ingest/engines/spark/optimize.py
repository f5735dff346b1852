"""Delta Spark's OPTIMIZE and VACUUM, for the tables ingest commits to through Delta Spark's
transaction (``ingest.sink.metadata.features.committed_by_delta_spark``): ingest's own
compaction writes with pyarrow and commits with delta-rs, which such a table refuses, and
Delta Spark keeps what those features ask of a rewrite (row ids and their commit versions,
deletion vectors purged into the new files, the clustering: OPTIMIZE clusters a clustered
table, in-commit timestamps, v2 checkpoints).

``SparkTableMaintenance`` is ``ingest.sink.maintenance.maintain.DeltaSparkMaintenance`` on
the Spark engine's session; a maintenance pass calls it from its own thread while batches
may land: OPTIMIZE conflicts with no blind append (Delta's WriteSerializable isolation), and
a MERGE it does conflict with is retried by its batch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ingest.errors import SinkError
from ingest.sink.maintenance.compact import Compaction
from ingest.sink.storage import TableLocation

__all__ = ["SparkTableMaintenance"]

log = logging.getLogger("ingest.sink")


class SparkTableMaintenance:
    """OPTIMIZE and VACUUM by Delta Spark on ``session``."""

    def __init__(self, session: Any) -> None:
        # A session of its own (the same SparkContext) for confs of its own: VACUUM lists
        # the table in as many tasks as partition discovery's parallelism, 10,000 by
        # default (measured: 53 s for a table of a few files on local[2], 10 s at 2).
        self.session = session.newSession()
        tasks = str(max(2, 2 * int(session.sparkContext.defaultParallelism)))
        self.session.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", tasks)
        self.session.conf.set("spark.sql.shuffle.partitions", tasks)

    def optimize(self, location: TableLocation) -> Compaction:
        """``OPTIMIZE``: its metrics, and the rows of the files its commit added (read from
        that commit's add actions; Delta Spark's metrics do not count rows)."""
        rows = self._sql(location, "OPTIMIZE {table}")
        metrics = rows[0]["metrics"] if rows else None
        if metrics is None:
            return Compaction(None, 0, 0, 0, 0)
        removed, added = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
        read = int(metrics["filesRemoved"]["totalSize"] or 0)
        if not removed and not added:
            return Compaction(None, 0, 0, 0, read)
        version = self._last_optimize(location)
        records = 0 if version is None else _added_records(location, version)
        log.info(
            "%s: Delta Spark's OPTIMIZE replaced %d files with %d (version %s)",
            location.uri,
            removed,
            added,
            version,
        )
        return Compaction(version, removed, added, records, read)

    def vacuum(self, location: TableLocation, *, full: bool) -> tuple[str, ...]:
        """``VACUUM`` by the table's own retention (Delta Spark 4.4 ignores a ``RETAIN``
        other than 0 hours: ``DELTA_VACUUM_RETENTION_WINDOW_IGNORE_ENABLED``), ``LITE``
        unless ``full`` (only files the log removed); the paths it deleted, as its DRY RUN
        listed them just before."""
        mode = "" if full else " LITE"
        listed = self._sql(location, f"VACUUM {{table}}{mode} DRY RUN")
        if not listed:
            return ()
        self._sql(location, f"VACUUM {{table}}{mode}")
        return tuple(sorted(str(row["path"]) for row in listed))

    def _last_optimize(self, location: TableLocation) -> int | None:
        """The version of the table's latest OPTIMIZE commit (appends may follow it)."""
        history = self._sql(location, "DESCRIBE HISTORY {table} LIMIT 20")
        versions = [int(r["version"]) for r in history if r["operation"] == "OPTIMIZE"]
        return max(versions, default=None)

    def _sql(self, location: TableLocation, statement: str) -> list[Any]:
        jvm = self.session._jvm
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.session._jsparkSession)
        table = "delta.`" + location.uri.replace("`", "``") + "`"
        text = statement.format(table=table)
        try:
            return list(self.session.sql(text).collect())
        except Exception as exc:  # pyspark's captured JVM errors
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SinkError(
                f"{location.uri}: Delta Spark's {text.split()[0]} failed: {first}"
            ) from None


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
