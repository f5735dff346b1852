"""What the workers report, applied to their partitions' state.

``Intake`` is the engine's answer to each worker event: a sealed segment or a
corrupt range joins the partition's pending items (or is released at once when the
table already holds it), a start or finish moves the partition's offsets and
lifecycle, a broker fault fails the partition for good. It decides, the pool does
(release, cap, abandon); nothing here blocks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ingest.errors import BrokerFaultError, LogTruncationError
from ingest.handoff import CorruptRangeReported, SegmentSealed
from ingest.handoff.store import HandoffSpaceExhausted
from ingest.logs import event
from ingest.supervisor.engine.backpressure import GlobalBufferCap
from ingest.supervisor.engine.batches import Item, item_next_offset
from ingest.supervisor.engine.partitions import Change, PartitionState, already_durable
from ingest.supervisor.engine.pool import WorkerPool
from ingest.supervisor.engine.source import Source
from ingest.supervisor.output.metrics import Metrics
from ingest.worker import (
    BackpressureChanged,
    Event,
    OffsetResetApplied,
    WorkerFailed,
    WorkerFinished,
    WorkerStarted,
)

__all__ = ["Intake"]

log = logging.getLogger("ingest.supervisor")


class Intake:
    """Applies worker events to ``PartitionState``s (the pool's ``on_event``)."""

    def __init__(
        self,
        source: Source,
        pool: WorkerPool,
        cap: GlobalBufferCap,
        metrics: Metrics,
        *,
        request_flush: Callable[[], None],
        warm_spark: Callable[[], None],
    ) -> None:
        self.source = source
        self.pool = pool
        self.cap = cap
        self.metrics = metrics
        self._request_flush = request_flush
        self._warm_spark = warm_spark

    def on_event(self, state: PartitionState, message: Event) -> None:
        if isinstance(message, SegmentSealed | CorruptRangeReported):
            self.on_item(state, message)
        elif isinstance(message, WorkerStarted):
            self._started(state, message)
        elif isinstance(message, WorkerFinished):
            self._finished(state, message)
        elif isinstance(message, WorkerFailed):
            self._failed(state, message)
        elif isinstance(message, BackpressureChanged):
            if message.reason == "handoff_full":
                event(
                    log,
                    "handoff_full" if message.paused else "handoff_room",
                    level=logging.WARNING if message.paused else logging.INFO,
                    partition=str(state.partition),
                    unacked_bytes=message.unacked_bytes,
                )
            if message.paused:
                self._request_flush()  # its segments must land before it fetches again
        elif isinstance(message, OffsetResetApplied):
            event(
                log,
                "offset_reset",
                level=logging.WARNING,
                partition=str(state.partition),
                old_offset=message.old_offset,
                new_offset=message.new_offset,
                policy=message.policy,
                reason=message.reason,
            )
            state.resume_offset = message.new_offset

    def _started(self, state: PartitionState, message: WorkerStarted) -> None:
        if state.first_offset is None:
            state.first_offset = message.start_offset
        state.end_offset = message.end_offset
        state.resume_offset = message.start_offset
        if state.landed_next is None:
            state.landed_next = message.start_offset
        event(
            log,
            "worker_started",
            partition=str(state.partition),
            pid=message.pid,
            start_offset=message.start_offset,
            end_offset=message.end_offset,
            how=message.how,
        )
        self.source.on_worker_started(state, message)

    def _finished(self, state: PartitionState, message: WorkerFinished) -> None:
        state.resume_offset = message.next_offset
        if message.reason == "end":
            state.change(Change.FINISH)
            state.finished_next = message.next_offset
            state.end_offset = message.next_offset  # an end time may come before the bound
        event(
            log,
            "worker_finished",
            partition=str(state.partition),
            reason=message.reason,
            next_offset=message.next_offset,
            records=message.records,
        )

    def _failed(self, state: PartitionState, message: WorkerFailed) -> None:
        partition = state.partition
        event(
            log,
            "worker_failed",
            level=logging.ERROR,
            partition=str(partition),
            offset=state.resume_offset,
            error=f"{message.error_type}: {message.message}",
        )
        if message.error_type == HandoffSpaceExhausted.__name__:
            # Every worker would meet the same full filesystem: no restart loop.
            raise HandoffSpaceExhausted(message.message)
        if message.error_type in (BrokerFaultError.__name__, LogTruncationError.__name__):
            # The same broker answers the same way: no restart, and what the worker
            # sealed but did not land may hold the records it condemns. A truncated log
            # (LogTruncationError) stays truncated: a restart would meet it again.
            state.change(Change.FAIL, failure=message.message)
            self.pool.abandon_pending(state)
            self.metrics.set(
                "ingest_partition_failed", 1, topic=partition.topic, partition=partition.partition
            )

    def on_item(self, state: PartitionState, item: Item) -> None:
        following = item_next_offset(item)
        if following is not None:
            state.resume_offset = max(state.resume_offset or 0, following)
        if isinstance(item, SegmentSealed):
            if state.start.kind == "timestamp" and not state.records and item.record_count:
                # The records before the start time were skipped: the range begins here.
                state.first_offset = item.first_offset
            labels = {"topic": item.topic, "partition": item.partition}
            self.metrics.inc("ingest_records_consumed_total", item.record_count, **labels)
            self.metrics.inc("ingest_bytes_consumed_total", item.bytes, **labels)
            state.records += item.record_count
            state.bytes += item.bytes
        else:
            event(
                log,
                "corrupt_range",
                level=logging.WARNING,
                partition=str(state.partition),
                first_offset=item.first_offset,
                last_offset=item.last_offset,
                reason=item.reason,
            )
        self.pool.apply_cap(self.cap.sealed(state.partition, item.bytes))
        if state.abandon:
            self.pool.release({state.partition: [item]})
            return
        if (
            not self.source.overwrite
            and not len(state.pending)
            and already_durable(item, state.durable_next)
        ):
            # Fetched again after a restart or a rebalance: the table has it; no Spark needed.
            if following is not None:
                state.landed_next = max(following, state.landed_next or 0)
            self.pool.release({state.partition: [item]})
            return
        state.pending.add(item, time.monotonic())
        self._warm_spark()
