"""Table maintenance in a continuous run, and on demand (``ingest maintain``).

``TableMaintainer`` belongs to the engine of ``ingest run``. Every ``maintenance.interval``
the main loop starts one pass (``ingest.sink.maintenance.maintain.maintain``) over the table
and its dead-letter table, on a thread of its own, when no batch is running; it
never waits for it. Why a thread: a compaction reads and rewrites up to
``target_file_size`` per bin and can take minutes on a big table, while the loop
must keep pumping workers, releasing segments and answering revocations within
the rebalance timeout. A batch may start while a pass runs: appends never
conflict with a compaction (``ingest/sink/maintenance/compact.py``), so neither waits for the
other beyond delta-rs's rebase of one commit. (A table only Delta Spark writes is compacted
by Delta Spark's OPTIMIZE on the Spark engine's executors, where a batch's job may wait for
its tasks: ``ingest/engines/spark/optimize.py``.) A pass that fails is logged and the
next one comes an interval later; a table that sets
``delta.setTransactionRetentionDuration`` stops the run (exit 2), as at start.

``check_tables`` refuses such a table at the start of every run, replay and
``ingest maintain``; ``maintain_tables`` is ``ingest maintain``'s one pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from deltalake import DeltaTable

from ingest.config import IngestConfig
from ingest.errors import ConfigError, IngestError
from ingest.logs import event
from ingest.processes import start_thread
from ingest.sink.maintenance.maintain import (
    DeltaSparkMaintenance,
    MaintenanceReport,
    check_txn_retention,
    load_table,
    maintain,
)
from ingest.sink.metadata.features import check_table, committed_by_delta_spark
from ingest.sink.metadata.probe_table import probe_properties
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import TableConfig, WriteMode
from ingest.supervisor.wiring import maintenance_settings, table_router

__all__ = ["TableMaintainer", "check_tables", "maintain_tables", "maintenance_fields"]

log = logging.getLogger("ingest.supervisor")


def _locations(config: IngestConfig, topics: Iterable[str] = ()) -> list[TableLocation]:
    """The table and its dead-letter table; with a ``{topic}`` uri, those of ``topics``
    (a shared dead-letter table once)."""
    return [location for location, _ in _tables(config, topics)]


def _tables(config: IngestConfig, topics: Iterable[str]) -> list[tuple[TableLocation, WriteMode]]:
    """Each table once, with the writes it takes: its table's mode, or "append" for a
    dead-letter table."""
    return [(location, mode) for location, mode, _ in _configured(config, topics)]


def _configured(
    config: IngestConfig, topics: Iterable[str]
) -> list[tuple[TableLocation, WriteMode, TableConfig | None]]:
    """Each table once, with its mode and its config (None: a dead-letter table)."""
    router = table_router(config)
    chosen = sorted(set(topics))
    tables = (
        [table for t in chosen for table in router.tables_for(t)]
        if router.per_topic
        else [router.default]
    )
    found: dict[str, tuple[TableLocation, WriteMode, TableConfig | None]] = {}
    for table in tables:
        location = TableLocation.of(table.uri, table.storage_options)
        found.setdefault(location.uri, (location, table.mode, table))
    for table in tables:
        location = TableLocation.of(table.dead_letters, table.dead_letter_options)
        found.setdefault(location.uri, (location, "append", None))
    return list(found.values())


def check_tables(config: IngestConfig, *, writing: bool = True, topics: Iterable[str] = ()) -> None:
    """Refuses a target table (or dead-letter table) whose txn entries expire, or one
    using a Delta feature ingest cannot honour (``ingest.sink.metadata.features``): for the
    writes of the table's mode (``writing``), and for compaction when maintenance compacts.
    A table not created yet is checked as its ``table.properties`` would make it."""
    maintenance = config.maintenance
    compacting = maintenance.compact and (maintenance.enabled or not writing)
    for location, use, target in _configured(config, topics):
        table = load_table(location)
        if table is None and target is not None and target.properties:
            # Not created yet: the table its properties would make, checked alike.
            with probe_properties(location.uri, target.properties, target.partition_by) as made:
                _check_uses(config, location.uri, made, use, writing, compacting)
            continue
        check_txn_retention(location, table)
        _check_uses(config, location.uri, table, use, writing, compacting)


def _check_uses(
    config: IngestConfig,
    uri: str,
    table: DeltaTable | None,
    use: WriteMode,
    writing: bool,
    compacting: bool,
) -> None:
    # The Spark engine commits through Delta Spark's transaction where delta-rs cannot
    # ("auto" picks Spark for such a table); Delta Spark's OPTIMIZE compacts such a table
    # (``maintain``), not ingest's compaction.
    if writing:
        check_table(uri, table, use, delta_spark=config.spark.engine != "local")
    if compacting and not committed_by_delta_spark(table):
        check_table(uri, table, "compact")


def maintain_tables(
    config: IngestConfig,
    topics: Iterable[str] = (),
    delta_spark: Callable[[], DeltaSparkMaintenance | None] | None = None,
) -> list[MaintenanceReport]:
    """One maintenance pass over the table and its dead-letter table (with a ``{topic}`` uri,
    those of ``topics``); ``delta_spark``: Delta Spark's maintenance, for the tables ingest
    commits to through Delta Spark (``maintain``)."""
    settings = maintenance_settings(config)
    check_tables(config, writing=False, topics=topics)
    return [maintain(location, settings, delta_spark) for location in _locations(config, topics)]


def maintenance_fields(maintenance: MaintenanceReport) -> dict[str, Any]:
    """A pass's outcome as log fields."""
    compaction = maintenance.compaction
    return {
        "table": maintenance.uri,
        "skipped": maintenance.skipped,
        "compacted_files": None if compaction is None else compaction.files_removed,
        "into_files": None if compaction is None else compaction.files_added,
        "compaction_lost_race": None if compaction is None else compaction.lost_race,
        "checkpoint": maintenance.checkpoint,
        "log_files_deleted": maintenance.log_files_deleted,
        "vacuumed": len(maintenance.vacuumed),
        "seconds": maintenance.seconds,
    }


class TableMaintainer:
    """The maintenance of a continuous run: one pass per interval, on its own thread."""

    def __init__(
        self,
        config: IngestConfig,
        delta_spark: Callable[[], DeltaSparkMaintenance | None] | None = None,
    ) -> None:
        self.config = config
        self.delta_spark = delta_spark  # the run's engine's (``LandingEngine``)
        self.topics: set[str] = set()  # with a {topic} uri: the tables to keep
        self.interval = float(config.maintenance.interval)
        self.next_at = time.monotonic() + self.interval
        self.passes = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def step(self, *, batch_running: bool) -> None:
        """On the main loop: raises what stops the run; starts a pass when due."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            error, self._error = self._error, None
            if isinstance(error, ConfigError):
                raise error
        if self._thread is None and not batch_running and time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + self.interval
            self.passes += 1
            self._thread = start_thread(f"maintenance-{self.passes}", self._pass)

    def _pass(self) -> None:
        try:
            passes = maintain_tables(self.config, sorted(self.topics), self.delta_spark)
            for maintenance in passes:
                event(
                    log, "maintenance_done", number=self.passes, **maintenance_fields(maintenance)
                )
        except ConfigError as exc:
            self._error = exc
        except IngestError as exc:
            event(log, "maintenance_failed", level=logging.WARNING, error=str(exc))
        except Exception as exc:  # delta-rs errors outside its own hierarchy
            event(
                log,
                "maintenance_failed",
                level=logging.WARNING,
                error=f"{type(exc).__name__}: {exc}",
            )

    def close(self) -> None:
        if self.running:
            event(log, "maintenance_abandoned", level=logging.INFO, number=self.passes)
