"""The local engine: a table without a transform on a local master lands in a pool of
task processes (``task_pool.py``) that run the Spark job's tasks without a JVM."""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from ingest.config import SparkSection
from ingest.engines.drive import drive_landing
from ingest.engines.local.task_pool import LocalFiles, LocalTasks, local_capable, local_decode_spec
from ingest.errors import ConfigError
from ingest.processes import TASK_MODULES, preload_in_fork_server, start_thread
from ingest.sink.batch import Batch, BatchResult
from ingest.sink.maintenance.maintain import load_table
from ingest.sink.metadata.features import through_delta_spark
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import TableConfig

__all__ = ["LocalEngine", "local_cores"]

log = logging.getLogger("ingest.supervisor.spark")


def _spark_only(*tables: TableConfig, overwrite: bool = False) -> str:
    """The features of the existing tables among ``tables`` that only Delta Spark's
    transaction writes (``features.through_delta_spark``) for their mode's writes, or
    (``overwrite``) a replay's cut, as text; empty: none."""
    found = []
    for table in tables:
        if "{topic}" in table.uri:
            continue  # resolved per topic; a batch's check_table refuses such a table
        existing = load_table(TableLocation.of(table.uri, table.storage_options))
        features = through_delta_spark(existing, table.mode)
        if overwrite:
            features += through_delta_spark(existing, "overwrite")
        features = sorted(set(features))
        if features:
            found.append(f"{table.uri}: {', '.join(features)}")
    return "; ".join(found)


def local_cores(master: str) -> int | None:
    """The cores of a ``local``/``local[N]``/``local[*]``/``local[N,F]`` master; None for
    any other (a cluster: the local engine does not apply)."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    if match.group(1) is None:
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


class LocalEngine:
    """Batches in the local engine's task processes (no JVM), its pool warmed on a
    background thread like a session."""

    def __init__(self, cores: int) -> None:
        self.tasks = LocalTasks(cores)
        # Per [[route]] (and per topic no route takes, per record selection, per topic
        # subject of a {topic} table): that table's own decode spec, built at its first
        # batch.
        self._specs: dict[tuple[Any, ...], Any] = {}
        self._thread: threading.Thread | None = None
        self.leave_jvm_at_exit = False  # no JVM: nothing to leave

    @classmethod
    def choose(
        cls,
        section: SparkSection,
        table: TableConfig,
        tables: tuple[TableConfig, ...] = (),
        *,
        overwrite: bool = False,
    ) -> LocalEngine | None:
        """The local engine when ``[spark] engine`` and the table (and every route's
        table, ``tables``) allow it; ``overwrite``: a replay's cut too."""
        if section.engine == "spark":
            return None

        cores = local_cores(section.master)
        capable = all(local_capable(t) for t in (table, *tables))
        spark_only = _spark_only(table, *tables, overwrite=overwrite)
        if cores is not None and capable and not spark_only:
            for checked in (table, *tables):  # refused here rather than at a first batch
                if checked.value_strategy is None:
                    local_decode_spec(checked)
            preload_in_fork_server(*TASK_MODULES)
            log.info("batches run on the local engine (%d task processes, no JVM)", cores)
            return cls(cores)
        if section.engine == "local":
            why = (
                f"spark.master {section.master!r} is not local"
                if cores is None
                else f"its table commits through Delta Spark's transaction ({spark_only})"
                if spark_only
                else "the table has a transform"
                if table.transform
                else "its value schema has a type only Spark can read into Arrow"
            )
            raise ConfigError(f'engine "local" cannot run this table: {why}', key="spark.engine")
        return None

    @property
    def starting(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def warm(self) -> None:
        if self._thread is not None:
            return

        def start() -> None:
            try:
                log.info(
                    "local engine: %d task processes up in %.1fs",
                    self.tasks.cores,
                    self.tasks.warm(),
                )
            except Exception as exc:  # the first batch meets the cause, with its context
                log.warning("local engine warm-up failed: %s", exc)

        self._thread = start_thread("local-start", start)

    def jvm_exit_code(self) -> int | None:
        return None  # no JVM

    def land(self, batch: Batch) -> BatchResult:
        if self._thread is not None:
            self._thread.join()
        table = batch.table
        key = (table.route, table.refuse, table.select, table.value_subject)
        spec = self._specs.get(key)
        if spec is None:
            spec = local_decode_spec(table)
            if spec is None:  # ``choose`` checked every route's table
                raise ConfigError(f"{table.uri}: only Spark can decode this table's values")
            self._specs[key] = spec
        return drive_landing(batch, LocalFiles(self.tasks, spec).write)

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self.tasks.stop()

    def table_maintenance(self) -> None:
        """None: no Spark here. ``choose`` picks Spark for a configured table only Delta
        Spark writes; such a table met later (a ``{topic}`` table) is skipped by
        maintenance, with the reason."""
        return None
