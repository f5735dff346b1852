"""What follows a batch: landed, its offsets become durable and committed and its segments
are released; failed, its segments go back to their partitions and ``retries`` decides
between a retry after a backoff and the end of the run."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ingest.errors import ConfigError, SinkError, SparkClusterLost, SparkStartError
from ingest.faults import fault_point
from ingest.group import Partition
from ingest.handoff import SegmentSealed
from ingest.logs import event
from ingest.sink.land import BatchResult
from ingest.supervisor.engine.batcher import jvm_exit_code, owner_of
from ingest.supervisor.engine.batches import BatchThread, Item, item_next_offset
from ingest.supervisor.engine.retries import Failure, classify

if TYPE_CHECKING:
    from ingest.supervisor.engine.runtime import Engine

__all__ = ["batch_failed", "batch_landed"]

log = logging.getLogger("ingest.supervisor")


def batch_landed(engine: Engine, batch: BatchThread, result: BatchResult, seconds: float) -> None:
    engine.batcher.retry.landed()
    engine.last_table_version = result.table_version
    engine.rows_written += result.rows_written
    for stage, spent in result.stage_seconds.items():
        engine.metrics.observe("ingest_batch_stage_seconds", spent, stage=stage)
    engine.metrics.inc("ingest_batches_total", outcome="ok")
    engine.metrics.inc("ingest_rows_written_total", result.rows_written)
    engine.metrics.inc("ingest_dead_letters_total", result.dead_letters)
    for partition, items in batch.selection.items.items():
        state = owner_of(engine.states, batch, partition)
        if state is None:
            continue
        durable = result.durable_offsets.get(partition)
        if durable is not None:
            state.durable = max(durable, state.durable if state.durable is not None else -1)
        following = [o for o in (item_next_offset(i) for i in items) if o is not None]
        if following:
            state.landed_next = max(max(following), state.landed_next or 0)
        segments = [i for i in items if isinstance(i, SegmentSealed)]
        if segments:
            last = max(segments, key=lambda i: i.next_offset)
            if last.leader_epoch >= 0:
                state.landed_epoch = last.leader_epoch
    event(
        log,
        "batch_committed",
        batch=batch.number,
        table_version=result.table_version,
        rows=result.rows_written,
        deleted=result.deleted_rows,
        dead_letters=result.dead_letters,
        path=result.path,
        seconds=round(seconds, 3),
        stages={k: round(v, 3) for k, v in result.stage_seconds.items()},
    )
    # Fault injection (a no-op unless INGEST_FAULT_POINT is set; ingest/faults.py).
    fault_point("after_delta_commit")
    # The table holds the batch: its segments can go, whatever the offset commit does.
    engine.source.after_batch(batch, result)
    engine.pool.release(batch.selection.items)


def batch_failed(engine: Engine, batch: BatchThread, error: BaseException, seconds: float) -> None:
    engine.metrics.inc("ingest_batches_total", outcome="failed")
    if isinstance(error, ConfigError):
        raise error
    jvm_exit = jvm_exit_code(engine.spark)
    failure = classify(
        error,
        jvm_exited=jvm_exit is not None,
        cluster_lost=isinstance(error, SparkClusterLost),
        spark_start=isinstance(error, SparkStartError),
    )
    now = time.monotonic()
    retry = engine.batcher.retry
    delay = retry.failed(failure, now)
    event(
        log,
        "batch_failed",
        level=logging.ERROR,
        batch=batch.number,
        attempt=retry.failures,
        seconds=round(seconds, 3),
        failure=failure.value,
        retry_in_s=None if delay is None else round(delay, 3),
        error=f"{type(error).__name__}: {error}",
    )
    abandoned: dict[Partition, tuple[Item, ...]] = {}
    for partition, items in batch.selection.items.items():
        state = owner_of(engine.states, batch, partition)
        if state is None or state.abandon:
            abandoned[partition] = items
        else:
            state.pending.put_back(items, now)
    engine.pool.release(abandoned)
    if delay is not None:
        return
    cause = f"{type(error).__name__}: {error}"
    if failure is Failure.JVM_EXITED:
        raise SinkError(
            f"the Spark JVM exited (code {jvm_exit}) during batch {batch.number}; "
            f"nothing of it was committed; rerun to land it ({cause})"
        ) from error
    if failure is Failure.CLUSTER_LOST:
        raise SinkError(f"batch {batch.number}: {error}") from error
    if failure is Failure.SPARK_START:
        raise SinkError(
            f"the Spark JVM exited or never answered while the session started, before "
            f"batch {batch.number}; nothing of it was committed; rerun to land it ({error})"
        ) from error
    spent = now - (retry.first_failed_at or now)
    raise SinkError(
        f"the batch failed {retry.failures} times in a row over {spent:.0f}s"
        + (f" (trigger.retry_for = {retry.retry_for:g}s)" if failure is Failure.TRANSIENT else "")
        + f"; last error: {cause}"
    ) from error
