"""Table maintenance: compaction, checkpoints, log retention and VACUUM, as one pass.

``maintain(location, settings) -> MaintenanceReport`` runs, in order:

1. ``check_txn_retention``: a table that sets ``delta.setTransactionRetentionDuration``
   is refused (``ConfigError``; also at the start of every run, replay and
   ``ingest maintain``). Delta drops txn entries older than that (delta-rs already
   hides them when it reads the table, and a checkpoint drops them for good), and
   ingest's exactly-once rests on them: a partition quiet for longer loses its txn
   version, so a restart between a Delta commit and its Kafka offset commit, or a
   replay, would land its offsets again.
2. compaction (``compact.py``), when ``settings.compact``.
3. log retention: ``delta.logRetentionDuration`` set to ``log_retention`` on the table
   when it says otherwise (one metadata commit, then Spark and delta-rs writers
   keep the same log; delta-rs's own post-commit cleanup follows it too).
4. a checkpoint when the table moved ``checkpoint_every`` versions past its last one
   (``_delta_log/_last_checkpoint``), then ``cleanup_metadata``: commit files older
   than the retention, before a checkpoint that is also older, go.
5. VACUUM, when ``settings.vacuum``: data files no longer in the table and older than
   ``vacuum_retention`` are deleted; with ``vacuum_full``, files the log never named
   too (a killed run's orphans). The retention is at least the table's own
   ``delta.deletedFileRetentionDuration`` and never below ``VACUUM_FLOOR_HOURS``.

A table ingest commits to through Delta Spark's transaction (row tracking, clustering,
in-commit timestamps...: ``features.committed_by_delta_spark``) takes steps 2 and 5 from
Delta Spark instead, through the Spark engine (``DeltaSparkMaintenance``): OPTIMIZE, which
keeps its row ids and deletion vectors right and clusters a clustered table, and VACUUM
(``LITE`` without ``vacuum_full``) by the table's own ``delta.deletedFileRetentionDuration``
(7 days unset; Delta Spark ignores a ``RETAIN``), and only when that is at least
``vacuum_retention``. Its checkpoints and log cleanup are its own commits'.

The floors (``VACUUM_FLOOR_HOURS``, ``LOG_RETENTION_FLOOR_SECONDS``; the config
refuses values below them with its file and key, ``ingest.config``):

* VACUUM deletes by age. A removed file may still be read by a query that started
  before its removal, a time-travel read or a streaming reader that lags, and a
  full VACUUM deletes files no commit names yet: a batch's Parquet files exist from
  the start of its Spark stage until its commit (seconds to minutes: the Spark tasks,
  the dead-letter commit, then at most 20 commit attempts with backoff capped at 2 s,
  and a stale batch is redone at most 5 times). 24 hours leaves a day of margin over
  all of them; Delta's own check is 168 hours, the default here.
* Log files: a commit's conflict check reads the commits since its snapshot, and
  ``ingest status`` and time travel read older ones; an hour is far above a batch.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from ingest.errors import ConfigError, SinkError
from ingest.sink.maintenance.compact import Compaction, compact
from ingest.sink.metadata.features import check_table, committed_by_delta_spark
from ingest.sink.storage import TableLocation

__all__ = [
    "LOG_RETENTION_FLOOR_SECONDS",
    "TXN_RETENTION_PROPERTY",
    "VACUUM_FLOOR_HOURS",
    "DeltaSparkMaintenance",
    "MaintenanceReport",
    "MaintenanceSettings",
    "check_txn_retention",
    "interval_seconds",
    "last_checkpoint",
    "load_table",
    "log_entries",
    "maintain",
]

log = logging.getLogger("ingest.sink")

VACUUM_FLOOR_HOURS = 24
LOG_RETENTION_FLOOR_SECONDS = 3600
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"
LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
FILE_RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
DELTA_FILE_RETENTION_HOURS = 168.0  # Delta's default deletedFileRetentionDuration

_UNITS = {
    "nanosecond": 1e-9,
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 604800.0,
}
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+([a-z]+?)s?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class MaintenanceSettings:
    """What a pass does (``[maintenance]`` in the config). Durations in seconds/hours."""

    compact: bool = True
    target_file_size: int = 128 * 1024**2
    checkpoint_every: int = 10
    log_retention_seconds: float = 30 * 86400.0
    vacuum: bool = True
    vacuum_retention_hours: float = 168.0
    vacuum_full: bool = True

    def __post_init__(self) -> None:
        if self.vacuum_retention_hours < VACUUM_FLOOR_HOURS:
            raise ConfigError(
                f"{self.vacuum_retention_hours:g}h is below the floor of {VACUUM_FLOOR_HOURS}h",
                key="maintenance.vacuum_retention",
            )
        if self.log_retention_seconds < LOG_RETENTION_FLOOR_SECONDS:
            raise ConfigError(
                f"{self.log_retention_seconds:g}s is below the floor of "
                f"{LOG_RETENTION_FLOOR_SECONDS}s",
                key="maintenance.log_retention",
            )
        if self.checkpoint_every < 1:
            raise ConfigError("must be at least 1", key="maintenance.checkpoint_every")
        if self.target_file_size < 1024**2:
            raise ConfigError("must be at least 1MiB", key="maintenance.target_file_size")


@dataclass(frozen=True)
class MaintenanceReport:
    """What one pass did on one table (None where a step did not run)."""

    uri: str
    compaction: Compaction | None = None
    checkpoint: int | None = None  # the version checkpointed
    log_files_deleted: int = 0
    vacuumed: tuple[str, ...] = ()
    skipped: str | None = None  # why nothing ran (no table yet)
    seconds: dict[str, float] = field(default_factory=dict)


def interval_seconds(text: str) -> float | None:
    """A Delta interval property ("interval 7 days") in seconds; None if unreadable."""
    match = _INTERVAL.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        return None
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def load_table(location: TableLocation) -> DeltaTable | None:
    try:
        return DeltaTable(location.uri, storage_options=location.delta_options())
    except TableNotFoundError:
        return None
    except DeltaError as exc:
        raise SinkError(f"{location.uri}: cannot load the table: {exc}") from exc


def check_txn_retention(location: TableLocation, table: DeltaTable | None = None) -> None:
    """Refuses a table whose txn entries expire (see the module docstring)."""
    table = table or load_table(location)
    if table is None:
        return
    configuration = table.metadata().configuration
    for key, value in configuration.items():
        if key.lower() == TXN_RETENTION_PROPERTY.lower() and value is not None:
            raise ConfigError(
                f"{location.uri}: the table sets {TXN_RETENTION_PROPERTY} = {value!r}. Delta "
                f"drops txn entries older than that, and ingest's exactly-once rests on them: "
                f"a partition quiet for longer would lose its txn version, and a restart "
                f"between a Delta commit and its Kafka offset commit, or a replay, would land "
                f"its offsets twice. Unset it (Spark SQL: ALTER TABLE delta.`{location.uri}` "
                f"UNSET TBLPROPERTIES ('{TXN_RETENTION_PROPERTY}'))"
            )


def last_checkpoint(location: TableLocation) -> int | None:
    """The version of the table's last checkpoint (``_last_checkpoint``), None if none."""
    filesystem, root = location.filesystem()
    try:
        with filesystem.open_input_stream(f"{root.rstrip('/')}/_delta_log/_last_checkpoint") as f:
            return int(json.loads(f.read())["version"])
    except (FileNotFoundError, OSError, ValueError, KeyError):
        return None


def log_entries(location: TableLocation) -> tuple[int, int]:
    """How many commit files and checkpoint files ``_delta_log`` holds."""
    filesystem, root = location.filesystem()
    try:
        listing = filesystem.get_file_info(pafs.FileSelector(f"{root.rstrip('/')}/_delta_log"))
    except (FileNotFoundError, OSError):
        return 0, 0
    names = [info.base_name for info in listing]
    commits = sum(1 for n in names if n.endswith(".json") and n[:20].isdigit())
    checkpoints = len({n[:20] for n in names if ".checkpoint" in n and n.endswith(".parquet")})
    return commits, checkpoints


class DeltaSparkMaintenance(Protocol):
    """Delta Spark's OPTIMIZE and VACUUM of one table, run by the Spark engine
    (``ingest/engines/spark/optimize.py``)."""

    def optimize(self, location: TableLocation, target_file_size: int) -> Compaction:
        """Compacts (and, on a clustered table, clusters) the table's files into files of
        up to ``target_file_size`` bytes."""
        ...

    def vacuum(self, location: TableLocation, *, full: bool) -> tuple[str, ...]:
        """Deletes the files the table no longer holds, by the table's own retention
        (``full``: files no commit named too); the paths deleted."""
        ...


def maintain(
    location: TableLocation,
    settings: MaintenanceSettings,
    delta_spark: Callable[[], DeltaSparkMaintenance | None] | None = None,
) -> MaintenanceReport:
    """One pass over one table (see the module docstring); ``delta_spark`` gives Delta
    Spark's maintenance, started on first need, for a table ingest commits to through
    Delta Spark (None, or a call that gives None: such a table is skipped)."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        seconds[name] = round(now - started, 3)
        started = now

    table = load_table(location)
    if table is None:
        return MaintenanceReport(location.uri, skipped="no table yet")
    check_txn_retention(location, table)
    spark_only = committed_by_delta_spark(table)
    if spark_only:
        spark = None if delta_spark is None else delta_spark()
        if spark is None:
            return MaintenanceReport(
                location.uri,
                skipped=f"{', '.join(spark_only)}: ingest commits to this table through Delta "
                "Spark's transaction, and maintains it with Delta Spark's OPTIMIZE and VACUUM, "
                "which need the Spark engine: the local engine has no Spark",
            )
        return _through_delta_spark(location, table, settings, spark, lap, seconds)
    compaction = None
    if settings.compact:
        check_table(location.uri, table, "compact")
        compaction = compact(location, target_size=settings.target_file_size, table=table)
        lap("compact")
    table = _set_log_retention(location, load_table(location) or table, settings)
    checkpoint = None
    version = table.version()
    done = last_checkpoint(location)
    if version - (-1 if done is None else done) >= settings.checkpoint_every:
        table.create_checkpoint()
        checkpoint = version
        lap("checkpoint")
    before, _ = log_entries(location)
    table.cleanup_metadata()
    deleted = max(0, before - log_entries(location)[0])
    lap("logs")
    vacuumed: tuple[str, ...] = ()
    if settings.vacuum:
        vacuumed = _vacuum(location, settings)
        lap("vacuum")
    return MaintenanceReport(
        location.uri, compaction, checkpoint, deleted, vacuumed, seconds=seconds
    )


def _through_delta_spark(
    location: TableLocation,
    table: DeltaTable,
    settings: MaintenanceSettings,
    spark: DeltaSparkMaintenance,
    lap: Callable[[str], None],
    seconds: dict[str, float],
) -> MaintenanceReport:
    """A pass over a table ingest commits to through Delta Spark: its OPTIMIZE (which
    clusters a clustered table) and VACUUM. Delta Spark's own commits write its
    checkpoints and clean its log by the table's own retention, and a delta-rs commit
    (the log retention property) would be refused, so those steps are left to it."""
    compaction = None
    if settings.compact:
        compaction = spark.optimize(location, settings.target_file_size)
        lap("compact")
    vacuumed: tuple[str, ...] = ()
    if settings.vacuum:
        # Delta Spark's VACUUM keeps removed files for the table's own
        # deletedFileRetentionDuration (7 days unset) and ignores a RETAIN: a table that
        # keeps them for less than vacuum_retention is not vacuumed.
        own = table.metadata().configuration.get(FILE_RETENTION_PROPERTY)
        own_seconds = None if own is None else interval_seconds(own)
        kept = DELTA_FILE_RETENTION_HOURS if own is None else (own_seconds or 0.0) / 3600
        wanted = max(settings.vacuum_retention_hours, VACUUM_FLOOR_HOURS)
        if own is not None and own_seconds is None:
            log.warning(
                "%s: not vacuumed: Delta Spark's VACUUM keeps removed files for the table's "
                "%s, %r, which ingest cannot read as a duration to check against "
                "maintenance.vacuum_retention",
                location.uri,
                FILE_RETENTION_PROPERTY,
                own,
            )
        elif kept >= wanted:
            vacuumed = spark.vacuum(location, full=settings.vacuum_full)
            lap("vacuum")
        else:
            log.warning(
                "%s: not vacuumed: Delta Spark's VACUUM keeps removed files for the table's "
                "%s (%gh), below maintenance.vacuum_retention (%gh); set the property to at "
                "least that to have it vacuumed",
                location.uri,
                FILE_RETENTION_PROPERTY,
                kept,
                wanted,
            )
    return MaintenanceReport(location.uri, compaction, vacuumed=vacuumed, seconds=seconds)


def _set_log_retention(
    location: TableLocation, table: DeltaTable, settings: MaintenanceSettings
) -> DeltaTable:
    """The table with ``delta.logRetentionDuration`` = the settings' (one commit if it
    said otherwise; a lost race leaves it for the next pass)."""
    seconds = math.ceil(settings.log_retention_seconds)
    current = table.metadata().configuration.get(LOG_RETENTION_PROPERTY)
    if current is not None and interval_seconds(current) == seconds:
        return table
    wanted = f"interval {seconds} seconds"
    try:
        table.alter.set_table_properties({LOG_RETENTION_PROPERTY: wanted})
    except CommitFailedError as exc:
        log.info("%s: setting %s lost a race: %s", location.uri, LOG_RETENTION_PROPERTY, exc)
        return table
    log.info("%s: %s = %r (was %r)", location.uri, LOG_RETENTION_PROPERTY, wanted, current)
    return load_table(location) or table


def _vacuum(location: TableLocation, settings: MaintenanceSettings) -> tuple[str, ...]:
    table = load_table(location)
    if table is None:
        return ()
    hours = max(settings.vacuum_retention_hours, VACUUM_FLOOR_HOURS)
    own = table.metadata().configuration.get(FILE_RETENTION_PROPERTY)
    own_seconds = None if own is None else interval_seconds(own)
    if own_seconds is not None:
        hours = max(hours, own_seconds / 3600)
    try:
        deleted = table.vacuum(
            retention_hours=math.ceil(hours),
            dry_run=False,
            # Our floor and the table's own property are checked above; delta-rs would
            # refuse anything below 168 hours otherwise.
            enforce_retention_duration=own is not None and own_seconds is None,
            full=settings.vacuum_full,
        )
    except CommitFailedError as exc:
        log.info("%s: vacuum's commit lost a race: %s", location.uri, exc)
        return ()
    except DeltaError as exc:
        raise SinkError(f"{location.uri}: vacuum failed: {exc}") from exc
    return tuple(sorted(deleted))
