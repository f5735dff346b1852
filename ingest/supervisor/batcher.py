"""The batcher: when a batch is due (the triggers), and the batch thread that lands it
through the Spark job. One batch runs at a time; its outcome is typed (``BatchThread``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ingest.config import TriggerSection
from ingest.group import Partition
from ingest.handoff import HandoffStore
from ingest.logs import event
from ingest.sink.config import TableConfig
from ingest.supervisor.backpressure import GlobalBufferCap
from ingest.supervisor.batches import BatchThread, select
from ingest.supervisor.partitions import PartitionState
from ingest.supervisor.sparksession import SparkProvider

__all__ = ["Batcher", "jvm_exit_code", "owner_of"]

log = logging.getLogger("ingest.supervisor")


class Batcher:
    """The batch in flight (``running``), the count of batches, and the triggers."""

    def __init__(
        self,
        trigger: TriggerSection,
        table: TableConfig,
        spark: SparkProvider,
        store: HandoffStore,
        cap: GlobalBufferCap,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.trigger = trigger
        self.on_done = on_done  # called on the batch's thread when it ends
        self.table = table
        self.spark = spark
        self.store = store
        self.cap = cap
        self.running: BatchThread | None = None
        self.count = 0
        self.failures = 0  # in a row
        self.next_at = 0.0  # after a failure: not before then
        self.flush = False  # land what is pending at the next chance

    def due(self, states: Mapping[Partition, PartitionState], *, draining: bool) -> bool:
        """Whether a batch should start now: none runs, and something pending is due
        (flush asked, the cap paused the workers, draining, or a trigger reached)."""
        if self.running is not None:
            return False
        now = time.monotonic()
        if now < self.next_at:
            return False
        pending = [s.pending for s in states.values() if len(s.pending)]
        if not pending:
            self.flush = False
            return False
        if self.spark.starting:
            # The batch would only wait for the session; planned later, it takes
            # everything sealed meanwhile (fewer, fuller batches).
            return False
        trigger = self.trigger
        if self.flush or self.cap.paused or draining:
            return True
        if sum(p.bytes for p in pending) >= int(trigger.max_bytes):
            return True
        if sum(p.records for p in pending) >= int(trigger.max_records):
            return True
        oldest = min(p.oldest() or now for p in pending)
        return now - oldest >= float(trigger.max_age)

    def start(self, states: Mapping[Partition, PartitionState], *, overwrite: bool) -> None:
        """Starts a batch of what is pending, on its own thread."""
        from spark_jobs.job import Batch

        trigger = self.trigger
        selection = select(
            {p: s.pending for p, s in states.items() if len(s.pending)},
            max_bytes=max(int(trigger.max_bytes), 1),
            max_records=max(int(trigger.max_records), 1),
        )
        self.flush = False
        batch = Batch(
            self.table,
            selection.segments(),
            selection.corrupt(),
            segment_storage_options=self.store.config.storage_options,
            overwrite=overwrite,
        )
        spark = self.spark

        def work() -> Any:
            return spark.land(batch)

        self.count += 1
        incarnations = {p: states[p].incarnation for p in selection.items}
        self.running = BatchThread(self.count, selection, incarnations, work, self.on_done)
        event(
            log,
            "batch_started",
            batch=self.count,
            partitions=len(selection.items),
            segments=len(batch.segments),
            corrupt=len(batch.corrupt),
            records=selection.records,
            bytes=selection.bytes,
        )


def owner_of(
    states: Mapping[Partition, PartitionState], batch: BatchThread, partition: Partition
) -> PartitionState | None:
    """The state the batch was started for, if it is still the current one."""
    state = states.get(partition)
    if state is None or state.incarnation != batch.incarnations.get(partition):
        return None
    return state


def jvm_exit_code(spark: SparkProvider) -> int | None:
    """The exit code of the Spark JVM this process launched, if it has exited."""
    session = spark.session_if_started()
    process = getattr(
        getattr(getattr(session, "sparkContext", None), "_gateway", None), "proc", None
    )
    code = None if process is None else process.poll()
    return None if code is None else int(code)
