"""The seam between the supervisor and the engines: ``LandingEngine``, the one protocol
both engines implement (``land(batch) -> BatchResult``), and ``choose_engine``, which picks
one for a run from ``[spark]`` and the tables."""

from __future__ import annotations

from typing import Any, Protocol

from ingest.config import IngestConfig, SparkSection
from ingest.engines.local.local_engine import LocalEngine
from ingest.engines.spark.spark_session import SparkEngine
from ingest.sink.batch import Batch, BatchResult
from ingest.sink.maintenance.maintain import DeltaSparkMaintenance
from ingest.sink.table_config import TableConfig

__all__ = ["LandingEngine", "choose_engine", "resolve_names"]


class LandingEngine(Protocol):
    """Lands one batch at a time; warmed in the background before the first."""

    # Set by the CLI, whose process ends after the run (the Spark JVM then stops itself).
    leave_jvm_at_exit: bool

    def land(self, batch: Batch) -> BatchResult:
        """One batch into its table, exactly once (``ingest.sink.land``)."""
        ...

    def warm(self) -> None:
        """Starts what the first batch needs, in the background (once)."""
        ...

    @property
    def starting(self) -> bool:
        """On its way up, and not failed: a due batch waits for it."""
        ...

    def jvm_exit_code(self) -> int | None:
        """The exit code of a JVM this engine launched, if it has exited."""
        ...

    def stop(self) -> None:
        """Stops what this engine started."""
        ...

    def table_maintenance(self) -> DeltaSparkMaintenance | None:
        """Delta Spark's OPTIMIZE and VACUUM, for the tables ingest commits to through
        Delta Spark (the Spark engine, its session started now if need be); None: this
        engine has no Spark."""
        ...


def choose_engine(
    section: SparkSection,
    session: Any | None = None,
    *,
    transform: bool = False,
    storage_options: dict[str, str] | None = None,
    table: TableConfig | None = None,
    tables: tuple[TableConfig, ...] = (),
    overwrite: bool = False,
) -> LandingEngine:
    """The local engine when ``[spark] engine`` and every table allow it (``overwrite``:
    for a replay's cut too; never with a given session); else Spark, on ``session`` or one
    started on first need."""
    if session is None and table is not None:
        local = LocalEngine.choose(section, table, tables, overwrite=overwrite)
        if local is not None:
            return local
    return SparkEngine(section, session, transform=transform, storage_options=storage_options)


def resolve_names(
    config: IngestConfig, session: Any | None = None
) -> tuple[IngestConfig, LandingEngine | None]:
    """``config`` with its tables by name (``table.name``, a route's ``name``) placed by
    Spark's catalog, and the Spark engine, on ``session`` or one started now, that placed
    them and lands the run's batches; without a name, ``config`` and None."""
    if not config.names_tables():
        return config, None
    engine = SparkEngine(
        config.spark,
        session,
        transform=bool(config.table.transform),
        storage_options=config.table_storage_options(),
    )
    return engine.resolve(config), engine
