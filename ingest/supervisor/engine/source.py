"""What an engine needs from where its partitions come from (``Source``), and what a run
ends with (``RunOutcome`` and the CLI's exit codes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingest.protocol.partition import Partition
from ingest.sink.batch import BatchResult
from ingest.supervisor.engine.batches import BatchThread
from ingest.supervisor.engine.partitions import PartitionState
from ingest.worker import WorkerStarted

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "RunOutcome", "Source"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    message: str
    batches: int = 0
    rows_written: int = 0
    failed: Mapping[Partition, str] = field(default_factory=dict)
    # A Spark batch still runs on its thread: the process should end with os._exit.
    batch_running: bool = False


class Source(Protocol):
    """Where an engine's partitions come from, and when its run is done: the consumer
    group (``group_run.GroupSource``) or a replay range (``replay.ReplaySource``). The
    engine calls each method at one point of its loop; a source acts on the engine through
    its public verbs (``new_state``, ``spawn``, ``retire``, ``abandon_pending``)."""

    mode: str
    # Replays with --overwrite replace the rows the table holds in their ranges.
    overwrite: bool

    def start(self) -> None:
        """Opens the source (joins the group, or lists the range) and spawns workers."""

    def poll(self) -> None:
        """Once per loop, after the wait for news: reads the source's own events."""

    def after_step(self) -> None:
        """Once per loop, after batches: revocations, commits, progress."""

    def after_batch(self, batch: BatchThread, result: BatchResult) -> None:
        """A batch is durable in the table; its segments are released next."""

    def on_worker_started(self, state: PartitionState, message: WorkerStarted) -> None:
        """A worker told where it starts."""

    def draining(self) -> bool:
        """Whether everything pending should land now."""
        ...

    def finished(self) -> bool:
        """Whether the run is done."""
        ...

    def complete(self) -> RunOutcome:
        """The outcome once ``finished``."""
        ...

    def close(self, outcome_ok: bool) -> None:
        """Leaves the source (the group), whatever happened."""

    def status(self) -> dict[str, Any]:
        """The source's part of ``Engine.status()``."""
        ...
