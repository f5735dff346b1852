"""The supervisor: partition workers, Spark batches, Delta commits, then Kafka commits.

``Engine`` is what ``ingest run`` and ``ingest replay`` share: one worker
process per partition fetching into Arrow segments, a main loop that collects
their sealed segments, starts a Spark batch when the ``[trigger]`` bounds are
reached (one batch at a time, on its own thread, so the loop keeps reading
workers and the group meanwhile), releases the segments once the batch is
durable in Delta, restarts crashed workers, and stops gracefully.

``GroupRun`` (``ingest run``) adds the consumer group: partitions come and go
with rebalances, a worker starts at max(committed offset, txn version + 1)
(invariant 3), and after each durable batch the owned partitions' offsets
are committed at txn version + 1 with the table version as metadata
(invariant 1). Nothing is committed for a partition no longer owned
(invariant 4): lost partitions are dropped at once and a batch result is
only committed for the partition incarnation that was owned when the batch
started. Revoked partitions wait for the in-flight batch that holds them,
are committed, then acknowledged; their segments not yet in a batch are
abandoned (the next owner fetches them again, and the txn filter makes any
overlap harmless).

Main loop, one iteration (at most ~50 ms when idle)::

    group events -> assignments, revocations, losses
    worker events -> pending segments, finished/crashed workers (restart with backoff)
    batch done?   -> durable offsets, commit, release segments
    trigger?      -> next batch (bytes / records / age / draining / buffer cap)
    stop?         -> workers seal and stop, the final batch, commit, leave
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.client import Cluster
from ingest.config import IngestConfig
from ingest.errors import (
    BrokerFaultError,
    ConfigError,
    FencedError,
    GroupError,
    IngestError,
    SinkError,
)
from ingest.faults import fault_point
from ingest.group import (
    CooperativeStickyAssignor,
    Fatal,
    Fenced,
    GroupConfig,
    MemberState,
    OffsetFetchFailed,
    Partition,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RangeAssignor,
    RoundRobinAssignor,
)
from ingest.group.assignors import Assignor
from ingest.handoff import CorruptRangeReported, HandoffConfig, HandoffStore, SegmentSealed
from ingest.logs import event
from ingest.supervisor.backpressure import CapDecision, GlobalBufferCap
from ingest.supervisor.batches import (
    BatchThread,
    Item,
    PendingItems,
    item_id,
    item_next_offset,
    select,
)
from ingest.supervisor.metrics import Metrics, MetricsServer
from ingest.supervisor.offsets import (
    end_offsets,
    fetch_settings,
    start_offset,
    table_config,
    topic_partitions,
    txn_versions,
)
from ingest.supervisor.sparksession import SparkProvider
from ingest.worker import (
    BackpressureChanged,
    EndPosition,
    OffsetResetApplied,
    Release,
    StartPosition,
    WorkerFailed,
    WorkerFinished,
    WorkerHandle,
    WorkerSettings,
    WorkerStarted,
    prestart_fork_server,
)

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "Engine", "GroupRun", "RunOutcome"]

log = logging.getLogger("ingest.supervisor")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2

_LOOP_WAIT = 0.05
_BATCH_ATTEMPTS = 3
_MAX_RESTART_BACKOFF = 60.0
_STATUS_EVERY = 0.5
_COMMIT_RETRY_AFTER = 2.0
_ASSIGNORS: dict[str, type[Assignor]] = {
    "cooperative-sticky": CooperativeStickyAssignor,
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
}


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    message: str
    batches: int = 0
    rows_written: int = 0
    failed: Mapping[Partition, str] = field(default_factory=dict)
    # A Spark batch still runs on its thread: the process should end with os._exit.
    batch_running: bool = False


@dataclass(eq=False)
class PartitionState:
    """The supervisor's view of one owned partition (one incarnation of its ownership)."""

    partition: Partition
    incarnation: int
    start: StartPosition
    end: EndPosition | None
    pending: PendingItems = field(default_factory=PendingItems)
    handle: WorkerHandle | None = None
    # Where a restarted worker starts: after the last item received.
    resume_offset: int | None = None
    first_offset: int | None = None
    end_offset: int | None = None
    finished: bool = False
    finished_next: int | None = None
    failed: str | None = None
    committed: int | None = None
    durable: int | None = None
    landed_next: int | None = None  # next offset after the last released (durable) item
    crashes: dict[int, int] = field(default_factory=dict)
    restart_at: float | None = None
    stopping: bool = False  # its worker was told to stop: no restart
    abandon: bool = False  # revoked: new segments are dropped, not batched
    records: int = 0
    bytes: int = 0

    @property
    def live(self) -> bool:
        return self.handle is not None

    def status(self) -> str:
        if self.failed:
            return "failed"
        if self.finished:
            return "finished"
        if self.handle is not None:
            return "running"
        if self.restart_at is not None:
            return "restarting"
        return "stopped" if self.stopping else "idle"


def _already_durable(item: Item, durable: int | None) -> bool:
    """Whether the table's txn version already covers every offset of ``item``."""
    if durable is None:
        return False
    if isinstance(item, SegmentSealed):
        return item.next_offset - 1 <= durable
    last = item.first_offset if item.last_offset is None else item.last_offset
    return last <= durable


def _jvm_exit_code(spark: SparkProvider) -> int | None:
    """The exit code of the Spark JVM this process launched, if it has exited."""
    session = spark.session_if_started()
    process = getattr(
        getattr(getattr(session, "sparkContext", None), "_gateway", None), "proc", None
    )
    code = None if process is None else process.poll()
    return None if code is None else int(code)


def handoff_config(config: IngestConfig) -> HandoffConfig:
    section = config.handoff
    options: dict[str, Any] = {}
    if section.root and section.root.startswith("s3://"):
        options = s3_options(config.table_storage_options())
    return HandoffConfig(
        mode=section.mode,
        root=section.root,
        storage_options=options,
        segment_max_bytes=int(section.segment_max_bytes),
        segment_max_age=float(section.segment_max_age),
    )


def s3_options(delta_options: Mapping[str, str]) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` arguments from delta-rs storage options (segments on S3
    use the table's endpoint and credentials)."""
    lowered = {k.lower(): v for k, v in delta_options.items()}
    out: dict[str, Any] = {}
    endpoint = lowered.get("aws_endpoint_url") or lowered.get("aws_endpoint")
    if endpoint:
        scheme, _, rest = (
            endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
        )
        out["endpoint_override"] = rest.rstrip("/")
        out["scheme"] = scheme
    for ours, theirs in (
        ("aws_access_key_id", "access_key"),
        ("aws_secret_access_key", "secret_key"),
        ("aws_session_token", "session_token"),
        ("aws_region", "region"),
    ):
        if lowered.get(ours):
            out[theirs] = lowered[ours]
    return out


def group_config(config: IngestConfig) -> GroupConfig:
    source = config.source
    return GroupConfig(
        group_id=source.group_id,
        group_instance_id=source.group_instance_id,
        session_timeout_ms=int(float(source.session_timeout) * 1000),
        heartbeat_interval_ms=int(float(source.heartbeat_interval) * 1000),
        rebalance_timeout_ms=int(float(source.rebalance_timeout) * 1000),
        assignors=tuple(_ASSIGNORS[name]() for name in source.assignors),
        leave_on_close=source.leave_group_on_shutdown,
    )


def spawn_worker(settings: WorkerSettings) -> WorkerHandle:
    """Spawns a worker that ignores SIGINT: Ctrl-C reaches the whole process group, and
    stopping workers is the supervisor's business (a graceful stop seals their segments).
    Workers fork from the fork server, which ignores SIGINT from its start."""
    prestart_workers()
    return WorkerHandle.spawn(settings, ignore_sigint=True)


def prestart_workers() -> None:
    """Starts the workers' fork server (once) with SIGINT ignored, so that its forks
    ignore it from their first instruction."""
    if threading.current_thread() is not threading.main_thread():
        prestart_fork_server()
        return
    # Blocked while the disposition is SIG_IGN, so a Ctrl-C in this window is not lost:
    # it is delivered to our own handler once unblocked.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        prestart_fork_server()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Engine:
    """Workers, batches, releases, restarts, shutdown; subclasses own the partitions."""

    mode = "engine"
    # Replays with --overwrite replace the rows the table holds in their ranges.
    overwrite = False

    def __init__(
        self,
        config: IngestConfig,
        *,
        spark: Any | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.client = config.client_config()
        self.table = table_config(config)
        self.fetch = fetch_settings(config)
        self.spark = SparkProvider(config.spark, spark, transform=bool(config.table.transform))
        self.metrics = metrics or Metrics()
        self.states: dict[Partition, PartitionState] = {}
        buffered = int(config.handoff.max_buffered_bytes)
        self.cap = GlobalBufferCap(max(buffered, 2), max(buffered, 2) // 2)
        self.store = HandoffStore(handoff_config(config))
        self.batch: BatchThread | None = None
        self.batches = 0
        self.rows_written = 0
        self.last_table_version: int | None = None
        self._batch_failures = 0
        self._next_batch_at = 0.0
        self._flush = False
        self._incarnation = 0
        self._retiring: list[WorkerHandle] = []
        self._stop_requested = threading.Event()
        self._stop_reason = ""
        self.stopping = False
        self._deadline = float("inf")
        self._status: dict[str, Any] = {"mode": self.mode, "partitions": []}
        self._status_at = 0.0
        self._metrics_server: MetricsServer | None = None
        self._cluster: Cluster | None = None

    # -- public ------------------------------------------------------------------------

    def request_stop(self, reason: str = "asked to stop") -> None:
        """Graceful stop (thread-safe; a signal handler may call it)."""
        self._stop_reason = reason
        self._stop_requested.set()

    def status(self) -> dict[str, Any]:
        """The last published view of the partitions (thread-safe: replaced, not mutated)."""
        return self._status

    @property
    def metrics_address(self) -> str | None:
        return None if self._metrics_server is None else self._metrics_server.address

    def run(self) -> RunOutcome:
        try:
            self._open()
            while True:
                self._step()
                if self._stop_requested.is_set() and not self.stopping:
                    self._begin_shutdown()
                if self.stopping and time.monotonic() > self._deadline:
                    return self._deadline_passed()
                if self._finished():
                    break
            return self._complete()
        except ConfigError as exc:
            event(log, "run_failed", level=logging.ERROR, error=str(exc))
            return self._outcome(EXIT_CONFIG, str(exc))
        except IngestError as exc:
            event(log, "run_failed", level=logging.ERROR, error=str(exc))
            return self._outcome(EXIT_FAILED, str(exc))
        finally:
            self._close()

    # -- hooks for the modes -----------------------------------------------------------

    def _start_source(self) -> None:
        raise NotImplementedError

    def _poll_source(self) -> None:
        """Reads the source of partitions (the group); nothing by default."""

    def _after_batch(self, batch: BatchThread, result: Any) -> None:
        """Called once a batch is durable, before its segments are released."""

    def _finished(self) -> bool:
        raise NotImplementedError

    def _complete(self) -> RunOutcome:
        failed = self._failed()
        if failed:
            text = "; ".join(f"{p}: {why}" for p, why in sorted(failed.items()))
            return self._outcome(EXIT_FAILED, f"{len(failed)} partition(s) failed: {text}")
        return self._outcome(EXIT_OK, "done")

    def _close_source(self, outcome_ok: bool) -> None:
        """Leaves the group, if any."""

    # -- the loop ----------------------------------------------------------------------

    def _open(self) -> None:
        self.store.open()
        prestart_workers()  # imports in the background while we join or list offsets
        listen = self.config.metrics.listen
        if listen:
            self._metrics_server = MetricsServer(
                self.metrics, listen, status=self.status, collector=self._collect_lag
            )
            event(log, "metrics_listening", address=self._metrics_server.address)
        self._cluster = Cluster(self.client)
        self._start_source()

    def _step(self) -> None:
        self._poll_source()
        self._pump_workers(_LOOP_WAIT)
        self._restart_due()
        if self.batch is not None and self.batch.done():
            self._finish_batch()
        self._after_step()
        if self._should_batch():
            self._start_batch()
        self._publish_status()

    def _after_step(self) -> None:
        """Mode-specific work once per loop (revocations, commit retries)."""

    def _failed(self) -> dict[Partition, str]:
        return {p: s.failed for p, s in self.states.items() if s.failed}

    def _outcome(self, code: int, message: str) -> RunOutcome:
        return RunOutcome(
            exit_code=code,
            message=message,
            batches=self.batches,
            rows_written=self.rows_written,
            failed=self._failed(),
            batch_running=self.batch is not None and not self.batch.done(),
        )

    def _close(self) -> None:
        running = self.batch is not None and not self.batch.done()
        for state in self.states.values():
            if state.handle is not None:
                state.handle.close(timeout=1.0)
                state.handle = None
        for handle in self._retiring:
            handle.close(timeout=1.0)
        self._retiring.clear()
        try:
            self._close_source(not running)
        except IngestError as exc:
            event(log, "leave_failed", level=logging.WARNING, error=str(exc))
        if self._cluster is not None:
            self._cluster.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if not running:
            self.store.close()
            self.spark.stop()

    def _begin_shutdown(self) -> None:
        self.stopping = True
        self._deadline = time.monotonic() + float(self.config.trigger.shutdown_timeout)
        event(
            log,
            "shutdown_started",
            reason=self._stop_reason,
            deadline_s=float(self.config.trigger.shutdown_timeout),
        )
        for state in self.states.values():
            state.stopping = True
            state.restart_at = None
            if state.handle is not None:
                state.handle.stop_after_seal()

    def _shutdown_done(self) -> bool:
        return (
            self.batch is None
            and not any(s.live for s in self.states.values())
            and not any(len(s.pending) for s in self.states.values())
        )

    def _deadline_passed(self) -> RunOutcome:
        message = (
            f"the shutdown deadline ({float(self.config.trigger.shutdown_timeout):g}s) passed "
            "before the last batch was durable; what it held is read again on the next run"
        )
        event(log, "shutdown_deadline_passed", level=logging.ERROR)
        for state in self.states.values():
            if state.handle is not None:
                state.handle.stop_now(wait=None)
        return self._outcome(EXIT_FAILED, message)

    # -- workers -----------------------------------------------------------------------

    def _new_state(
        self, partition: Partition, start: StartPosition, end: EndPosition | None
    ) -> PartitionState:
        self._incarnation += 1
        state = PartitionState(partition, self._incarnation, start, end)
        self.states[partition] = state
        return state

    def _worker_settings(self, state: PartitionState) -> WorkerSettings:
        start = (
            StartPosition.offset(state.resume_offset)
            if state.resume_offset is not None
            else state.start
        )
        return WorkerSettings(
            client=self.client,
            topic=state.partition.topic,
            partition=state.partition.partition,
            handoff=self.store.location,
            start=start,
            end=state.end,
            fetch=self.fetch,
            max_unacked_bytes=int(self.config.worker.max_unacked_bytes),
            resume_unacked_bytes=int(self.config.worker.resume_unacked_bytes),
            log_level=self.config.logging.level.upper(),
            log_format=self.config.logging.format,
        )

    def _spawn(self, state: PartitionState) -> None:
        state.restart_at = None
        state.handle = spawn_worker(self._worker_settings(state))
        if self.cap.paused:
            state.handle.pause()

    def _live_handles(self) -> list[tuple[PartitionState | None, WorkerHandle]]:
        pairs: list[tuple[PartitionState | None, WorkerHandle]] = [
            (s, s.handle) for s in self.states.values() if s.handle is not None
        ]
        pairs += [(None, h) for h in self._retiring]
        return pairs

    def _pump_workers(self, timeout: float) -> None:
        pairs = self._live_handles()
        if not pairs:
            time.sleep(timeout)
            return
        waitables: list[Any] = []
        for _, handle in pairs:
            if not handle.events_closed:
                waitables.append(handle.connection)
            waitables.append(handle.sentinel)
        multiprocessing.connection.wait(waitables, timeout)
        for state, handle in pairs:
            events = handle.receive(0.0)
            if state is None:
                self._drop_items(
                    [e for e in events if isinstance(e, SegmentSealed | CorruptRangeReported)]
                )
                if handle.events_closed and not handle.alive:
                    handle.close(timeout=0.5)
                    self._retiring.remove(handle)
                continue
            for worker_event in events:
                self._on_worker_event(state, worker_event)
            if handle.events_closed and not handle.alive:
                self._on_worker_exit(state)

    def _on_worker_event(self, state: PartitionState, message: Any) -> None:
        partition = state.partition
        if isinstance(message, SegmentSealed | CorruptRangeReported):
            self._on_item(state, message)
        elif isinstance(message, WorkerStarted):
            state.first_offset = (
                message.start_offset if state.first_offset is None else state.first_offset
            )
            state.end_offset = message.end_offset
            state.resume_offset = message.start_offset
            if state.landed_next is None:
                state.landed_next = message.start_offset
            event(
                log,
                "worker_started",
                partition=str(partition),
                pid=message.pid,
                start_offset=message.start_offset,
                end_offset=message.end_offset,
                how=message.how,
            )
            self._on_worker_started(state, message)
        elif isinstance(message, WorkerFinished):
            state.resume_offset = message.next_offset
            if message.reason == "end":
                state.finished = True
                state.finished_next = message.next_offset
                state.end_offset = message.next_offset  # an end time may come before the bound
            event(
                log,
                "worker_finished",
                partition=str(partition),
                reason=message.reason,
                next_offset=message.next_offset,
                records=message.records,
            )
        elif isinstance(message, WorkerFailed):
            event(
                log,
                "worker_failed",
                level=logging.ERROR,
                partition=str(partition),
                offset=state.resume_offset,
                error=f"{message.error_type}: {message.message}",
            )
            if message.error_type == BrokerFaultError.__name__:
                # The same broker answers the same way: no restart, and what the worker
                # sealed but did not land may hold the records it condemns.
                state.failed = message.message
                self._abandon_pending(state)
                self.metrics.set(
                    "ingest_partition_failed",
                    1,
                    topic=partition.topic,
                    partition=partition.partition,
                )
        elif isinstance(message, BackpressureChanged):
            if message.paused:
                self._flush = True  # its segments must land before it fetches again
        elif isinstance(message, OffsetResetApplied):
            event(
                log,
                "offset_reset",
                level=logging.WARNING,
                partition=str(partition),
                old_offset=message.old_offset,
                new_offset=message.new_offset,
                policy=message.policy,
                reason=message.reason,
            )
            state.resume_offset = message.new_offset

    def _on_worker_started(self, state: PartitionState, message: WorkerStarted) -> None:
        """Mode hook (replay checks for gaps)."""

    def _on_item(self, state: PartitionState, item: Item) -> None:
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
        self._apply_cap(self.cap.sealed(state.partition, item.bytes))
        if state.abandon:
            self._release({state.partition: [item]})
            return
        if not self.overwrite and not len(state.pending) and _already_durable(item, state.durable):
            # Fetched again after a restart or a rebalance: the table has it; no Spark needed.
            if following is not None:
                state.landed_next = max(following, state.landed_next or 0)
            self._release({state.partition: [item]})
            return
        state.pending.add(item, time.monotonic())
        self.spark.warm()

    def _on_worker_exit(self, state: PartitionState) -> None:
        handle = state.handle
        assert handle is not None
        state.handle = None
        reason = handle.exit_reason() or "ended"
        code = handle.exitcode
        handle.close(timeout=0.5)
        if state.stopping or state.finished or state.failed or self.stopping:
            return
        offset = state.resume_offset if state.resume_offset is not None else -1
        crashes = state.crashes.get(offset, 0) + 1
        state.crashes[offset] = crashes
        labels: dict[str, object] = {
            "topic": state.partition.topic,
            "partition": state.partition.partition,
        }
        limit = int(self.config.worker.max_restarts_at_same_offset)
        if crashes > limit:
            state.failed = f"the worker crashed {crashes} times at offset {offset}, last: {reason}"
            self.metrics.set("ingest_partition_failed", 1, **labels)
            event(
                log,
                "partition_failed",
                level=logging.ERROR,
                partition=str(state.partition),
                offset=offset,
                crashes=crashes,
                error=reason,
            )
            return
        delay = min(
            float(self.config.worker.restart_backoff) * 2 ** (crashes - 1), _MAX_RESTART_BACKOFF
        )
        state.restart_at = time.monotonic() + delay
        self.metrics.inc("ingest_worker_restarts_total", 1, **labels)
        event(
            log,
            "worker_crashed",
            level=logging.WARNING,
            partition=str(state.partition),
            offset=offset,
            exit_code=code,
            error=reason,
            restart_in_s=round(delay, 3),
            crashes_at_offset=crashes,
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for state in self.states.values():
            if (
                state.restart_at is not None
                and now >= state.restart_at
                and state.handle is None
                and not state.failed
                and not state.stopping
            ):
                self._spawn(state)

    def _retire(self, state: PartitionState) -> None:
        """Stops the worker at once; its late segments are dropped when they arrive."""
        if state.handle is not None:
            state.handle.stop_now(wait=None)
            self._retiring.append(state.handle)
            state.handle = None
        state.stopping = True
        state.restart_at = None

    def _apply_cap(self, decision: CapDecision | None) -> None:
        if decision is None:
            return
        pause = decision is CapDecision.PAUSE_ALL
        if pause:
            self._flush = True
        event(log, "buffer_cap", paused=pause, held_bytes=self.cap.held_bytes)
        for state in self.states.values():
            if state.handle is not None:
                if pause:
                    state.handle.pause()
                else:
                    state.handle.resume()

    def _release(self, items: Mapping[Partition, Iterable[Item]]) -> None:
        for partition, chosen in items.items():
            chosen = list(chosen)
            if not chosen:
                continue
            ids = [item_id(i) for i in chosen]
            self.store.release(ids)
            state = self.states.get(partition)
            if state is not None and state.handle is not None:
                state.handle.send(Release(tuple(ids)))
            self._apply_cap(self.cap.released(partition, sum(i.bytes for i in chosen)))

    def _drop_items(self, items: list[Any]) -> None:
        by_partition: dict[Partition, list[Item]] = {}
        for item in items:
            by_partition.setdefault(Partition(item.topic, item.partition), []).append(item)
        for partition, chosen in by_partition.items():
            self._apply_cap(self.cap.sealed(partition, sum(i.bytes for i in chosen)))
        self._release(by_partition)

    def _abandon_pending(self, state: PartitionState) -> None:
        self._release({state.partition: state.pending.clear()})

    # -- batches -----------------------------------------------------------------------

    def _draining(self) -> bool:
        """Everything pending should land now (no more is coming soon)."""
        return self.stopping or not any(s.live for s in self.states.values())

    def _should_batch(self) -> bool:
        if self.batch is not None:
            return False
        now = time.monotonic()
        if now < self._next_batch_at:
            return False
        pending = [s.pending for s in self.states.values() if len(s.pending)]
        if not pending:
            self._flush = False
            return False
        if self.spark.starting:
            # The batch would only wait for the session; planned later, it takes
            # everything sealed meanwhile (fewer, fuller batches).
            return False
        trigger = self.config.trigger
        if self._flush or self.cap.paused or self._draining():
            return True
        if sum(p.bytes for p in pending) >= int(trigger.max_bytes):
            return True
        if sum(p.records for p in pending) >= int(trigger.max_records):
            return True
        oldest = min(p.oldest() or now for p in pending)
        return now - oldest >= float(trigger.max_age)

    def _start_batch(self) -> None:
        from spark_jobs.job import Batch, run_batch

        trigger = self.config.trigger
        selection = select(
            {p: s.pending for p, s in self.states.items() if len(s.pending)},
            max_bytes=max(int(trigger.max_bytes), 1),
            max_records=max(int(trigger.max_records), 1),
        )
        self._flush = False
        batch = Batch(
            self.table,
            selection.segments(),
            selection.corrupt(),
            segment_storage_options=self.store.config.storage_options,
            overwrite=self.overwrite,
        )
        spark = self.spark

        def work() -> Any:
            return run_batch(spark.get(), batch)

        self.batches += 1
        incarnations = {p: self.states[p].incarnation for p in selection.items}
        self.batch = BatchThread(self.batches, selection, incarnations, work)
        event(
            log,
            "batch_started",
            batch=self.batches,
            partitions=len(selection.items),
            segments=len(batch.segments),
            corrupt=len(batch.corrupt),
            records=selection.records,
            bytes=selection.bytes,
        )

    def _owner_of(self, batch: BatchThread, partition: Partition) -> PartitionState | None:
        """The state the batch was started for, if it is still the current one."""
        state = self.states.get(partition)
        if state is None or state.incarnation != batch.incarnations.get(partition):
            return None
        return state

    def _finish_batch(self) -> None:
        batch = self.batch
        assert batch is not None
        self.batch = None
        result, error = batch.outcome()
        seconds = time.monotonic() - batch.started
        if error is not None:
            self._batch_failed(batch, error, seconds)
            return
        self._batch_failures = 0
        self.last_table_version = result.table_version
        self.rows_written += result.rows_written
        for stage, spent in result.stage_seconds.items():
            self.metrics.observe("ingest_batch_stage_seconds", spent, stage=stage)
        self.metrics.inc("ingest_batches_total", outcome="ok")
        self.metrics.inc("ingest_rows_written_total", result.rows_written)
        self.metrics.inc("ingest_dead_letters_total", result.dead_letters)
        for partition, items in batch.selection.items.items():
            state = self._owner_of(batch, partition)
            if state is None:
                continue
            durable = result.durable_offsets.get((partition.topic, partition.partition))
            if durable is not None:
                state.durable = max(durable, state.durable if state.durable is not None else -1)
            following = [o for o in (item_next_offset(i) for i in items) if o is not None]
            if following:
                state.landed_next = max(max(following), state.landed_next or 0)
        event(
            log,
            "batch_committed",
            batch=batch.number,
            table_version=result.table_version,
            rows=result.rows_written,
            dead_letters=result.dead_letters,
            path=result.path,
            seconds=round(seconds, 3),
            stages={k: round(v, 3) for k, v in result.stage_seconds.items()},
        )
        # Fault injection (a no-op unless INGEST_FAULT_POINT is set; ingest/faults.py).
        fault_point("after_delta_commit")
        self._after_batch(batch, result)
        fault_point("after_offset_commit")
        self._release(batch.selection.items)

    def _batch_failed(self, batch: BatchThread, error: BaseException, seconds: float) -> None:
        self.metrics.inc("ingest_batches_total", outcome="failed")
        if isinstance(error, ConfigError):
            raise error
        self._batch_failures += 1
        jvm_exit = _jvm_exit_code(self.spark)
        event(
            log,
            "batch_failed",
            level=logging.ERROR,
            batch=batch.number,
            attempt=self._batch_failures,
            seconds=round(seconds, 3),
            error=f"{type(error).__name__}: {error}",
        )
        now = time.monotonic()
        abandoned: dict[Partition, tuple[Item, ...]] = {}
        for partition, items in batch.selection.items.items():
            state = self._owner_of(batch, partition)
            if state is None or state.abandon:
                abandoned[partition] = items
            else:
                state.pending.put_back(items, now)
        self._release(abandoned)
        if jvm_exit is not None:
            # A dead JVM fails every later batch too: say so now instead of retrying.
            raise SinkError(
                f"the Spark JVM exited (code {jvm_exit}) during batch {batch.number}; "
                f"nothing of it was committed; rerun to land it ({type(error).__name__}: "
                f"{error})"
            ) from error
        if self._batch_failures >= _BATCH_ATTEMPTS:
            raise SinkError(
                f"the batch failed {self._batch_failures} times in a row; last error: "
                f"{type(error).__name__}: {error}"
            ) from error
        self._next_batch_at = now + 2.0**self._batch_failures

    # -- status and metrics ------------------------------------------------------------

    def _publish_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._status_at < _STATUS_EVERY:
            return
        self._status_at = now
        partitions = []
        for partition, state in sorted(self.states.items()):
            labels = {"topic": partition.topic, "partition": partition.partition}
            if state.committed is not None:
                self.metrics.set("ingest_partition_committed_offset", state.committed, **labels)
            if state.durable is not None:
                self.metrics.set("ingest_partition_durable_offset", state.durable, **labels)
            partitions.append(
                {
                    "topic": partition.topic,
                    "partition": partition.partition,
                    "state": state.status(),
                    "pid": None if state.handle is None else state.handle.pid,
                    "committed": state.committed,
                    "durable": state.durable,
                    "position": state.resume_offset,
                    "end": state.end_offset,
                    "pending_items": len(state.pending),
                    "records": state.records,
                    "error": state.failed,
                }
            )
        self.metrics.set("ingest_partitions_assigned", len(self.states))
        self.metrics.set("ingest_buffered_bytes", self.cap.held_bytes)
        self._status = {
            "mode": self.mode,
            "stopping": self.stopping,
            "batches": self.batches,
            "batch_running": self.batch is not None,
            "rows_written": self.rows_written,
            "table_version": self.last_table_version,
            **self._source_status(),
            "partitions": partitions,
        }

    def _source_status(self) -> dict[str, Any]:
        return {}

    def _collect_lag(self, metrics: Metrics) -> None:
        """At scrape time, on the metrics thread: end offsets of the owned partitions."""
        rows = list(self._status.get("partitions", []))
        if not rows:
            return
        partitions = [Partition(r["topic"], r["partition"]) for r in rows]
        with Cluster(self.client) as cluster:
            ends = end_offsets(cluster, partitions, self.fetch)
        for row in rows:
            partition = Partition(row["topic"], row["partition"])
            labels = {"topic": partition.topic, "partition": partition.partition}
            end = ends[partition]
            metrics.set("ingest_partition_end_offset", end, **labels)
            position = row["committed"] if row["committed"] is not None else 0
            metrics.set("ingest_partition_lag", max(end - position, 0), **labels)


class GroupRun(Engine):
    """``ingest run``: the partitions the consumer group assigns, committed after Delta.

    ``until_end``: each partition's end offset is snapshotted at start; the run
    lands everything before it, commits, leaves the group and returns.
    """

    mode = "run"

    def __init__(
        self,
        config: IngestConfig,
        *,
        until_end: bool = False,
        spark: Any | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(config, spark=spark, metrics=metrics)
        self.until_end = until_end
        self.mode = "run --until-end" if until_end else "run"
        self.group = group_config(config)
        self.member: Any = None
        self.ends: dict[Partition, int] = {}
        self.revocations: deque[frozenset[Partition]] = deque()
        self.joined = False
        self._commit_after = 0.0
        self._fatal: IngestError | None = None

    # -- the source: the group ---------------------------------------------------------

    def _start_source(self) -> None:
        from ingest.supervisor.membership import GroupMember

        assert self._cluster is not None
        topics = self.config.source.topics
        try:
            partitions = topic_partitions(self._cluster, topics)
        except IngestError as exc:
            raise IngestError(
                f"cannot read the metadata of {', '.join(topics)} from "
                f"{', '.join(self.config.kafka.bootstrap_servers)}: {exc}"
            ) from exc
        if self.until_end:
            self.ends = end_offsets(self._cluster, partitions, self.fetch)
            event(
                log,
                "end_offsets",
                ends={str(p): o for p, o in sorted(self.ends.items())},
            )
            # The table lacks offsets below the ends: a batch will come, so the JVM starts
            # now, overlapping the JoinGroup and the fetching.
            durable = txn_versions(self.table, partitions)
            if any(end > (start_offset(None, durable[p]) or 0) for p, end in self.ends.items()):
                self.spark.warm()
        else:
            self.spark.warm()
        self.member = GroupMember(self.client, self.group)
        self.member.subscribe(topics)
        event(
            log,
            "joining",
            group=self.group.group_id,
            topics=",".join(topics),
            protocol=self.group.rebalance_protocol.value,
            static=self.group.is_static,
        )

    def _poll_source(self) -> None:
        member = self.member
        try:
            events = member.poll(0.0)
        except GroupError as exc:
            raise GroupError(f"the group membership failed: {exc}") from exc
        for item in events:
            if isinstance(item, PartitionsAssigned):
                self._assigned(item)
            elif isinstance(item, PartitionsRevoked):
                self._revoked(item.partitions)
            elif isinstance(item, PartitionsLost):
                self._lost(item.partitions, item.reason)
            elif isinstance(item, Fenced):
                raise FencedError(f"fenced out of group {self.group.group_id!r}: {item.reason}")
            elif isinstance(item, Fatal):
                raise GroupError(
                    f"group {self.group.group_id!r}: {item.error_name}: {item.message}"
                )

    def _assigned(self, assigned: PartitionsAssigned) -> None:
        self.joined = True
        self.metrics.inc("ingest_rebalances_total")
        new = sorted(p for p in assigned.assignment if p not in self.states)
        event(
            log,
            "partitions_assigned",
            generation=assigned.generation_id,
            member_id=assigned.member_id,
            assignment=",".join(str(p) for p in sorted(assigned.assignment)),
            new=",".join(str(p) for p in new),
        )
        if not new:
            return
        committed = self._fetch_committed(new)
        durable = txn_versions(self.table, new)
        missing = [p for p in new if self.until_end and p not in self.ends]
        if missing:
            assert self._cluster is not None
            self.ends.update(end_offsets(self._cluster, missing, self.fetch))
        repairs: dict[Partition, int] = {}
        for partition in new:
            offset = start_offset(committed[partition], durable[partition])
            if offset is not None:
                start = StartPosition.offset(offset)
            elif self.config.source.auto_offset_reset == "latest":
                start = StartPosition.latest()
            else:
                start = StartPosition.earliest()
            end = EndPosition.offset(self.ends[partition]) if self.until_end else None
            state = self._new_state(partition, start, end)
            state.committed = committed[partition]
            state.durable = durable[partition]
            if offset is not None and (committed[partition] or 0) < offset:
                # The table is ahead of the group (a crash between the two commits).
                repairs[partition] = offset
            if offset is None and self.config.source.auto_offset_reset == "fail":
                state.failed = "no committed offset and source.auto_offset_reset = fail"
                continue
            if end is not None and offset is not None and offset >= self.ends[partition]:
                state.finished = True
                state.first_offset = state.landed_next = state.resume_offset = offset
                continue
            self._spawn(state)
        if repairs:
            self._commit(repairs, "repair")

    def _fetch_committed(self, partitions: list[Partition]) -> dict[Partition, int | None]:
        deadline = time.monotonic() + float(self.config.kafka.retry_timeout)
        while True:
            answer = self.member.fetch_committed(
                partitions, timeout=float(self.config.kafka.request_timeout) + 5
            )
            if not isinstance(answer, OffsetFetchFailed):
                return {
                    p: (None if answer.offsets.get(p) is None else answer.offsets[p].offset)
                    for p in partitions
                }
            if not answer.retriable or time.monotonic() > deadline:
                raise GroupError(
                    f"OffsetFetch for {', '.join(map(str, partitions))} failed: "
                    f"{answer.error_name}: {answer.message}"
                )
            time.sleep(0.2)

    def _revoked(self, partitions: frozenset[Partition]) -> None:
        event(log, "partitions_revoked", partitions=",".join(str(p) for p in sorted(partitions)))
        for partition in partitions:
            state = self.states.get(partition)
            if state is None:
                continue
            state.abandon = True
            self._retire(state)
            self._abandon_pending(state)
        self.revocations.append(partitions)

    def _lost(self, partitions: frozenset[Partition], reason: str) -> None:
        event(
            log,
            "partitions_lost",
            level=logging.WARNING,
            partitions=",".join(str(p) for p in sorted(partitions)),
            reason=reason,
        )
        self.metrics.inc("ingest_partitions_lost_total", len(partitions))
        for partition in partitions:
            state = self.states.pop(partition, None)
            if state is None:
                continue
            state.abandon = True
            self._retire(state)
            self._abandon_pending(state)
            self.metrics.remove(
                "ingest_partition_failed", topic=partition.topic, partition=partition.partition
            )

    def _after_step(self) -> None:
        self._process_revocations()
        if time.monotonic() >= self._commit_after:
            self._commit_owned()

    def _process_revocations(self) -> None:
        while self.revocations:
            partitions = self.revocations[0]
            if self.batch is not None and self.batch.partitions & partitions:
                return  # the in-flight batch holding them finishes first
            self._commit_owned(partitions)
            for partition in partitions:
                self.states.pop(partition, None)
            self.revocations.popleft()
            self.member.revocation_done()

    # -- commits -----------------------------------------------------------------------

    def _commit_target(self, state: PartitionState) -> int | None:
        target = None if state.durable is None else state.durable + 1
        in_flight = self.batch is not None and state.partition in self.batch.partitions
        if (
            state.finished
            and state.finished_next is not None
            and not len(state.pending)
            and not in_flight
        ):
            # Past the last data record: only control records (no rows) lie between.
            target = max(target or 0, state.finished_next)
        return target

    def _committable(self) -> frozenset[Partition]:
        revoking = frozenset().union(*self.revocations) if self.revocations else frozenset()
        return frozenset(self.member.assignment) | revoking

    def _commit_owned(self, only: Iterable[Partition] | None = None) -> None:
        owned = self._committable()
        offsets: dict[Partition, int] = {}
        for partition in only if only is not None else list(self.states):
            state = self.states.get(partition)
            if state is None or partition not in owned:
                continue
            target = self._commit_target(state)
            if target is not None and (state.committed is None or target > state.committed):
                offsets[partition] = target
        if offsets:
            self._commit(offsets, "batch")

    def _commit(self, offsets: Mapping[Partition, int], why: str) -> None:
        from ingest.supervisor.membership import check_commit

        metadata = None if self.last_table_version is None else str(self.last_table_version)
        try:
            outcome = self.member.commit(
                offsets, metadata, timeout=float(self.config.kafka.request_timeout) + 5
            )
            check_commit(outcome)
        except (GroupError, TimeoutError) as exc:
            self.metrics.inc("ingest_offset_commits_total", outcome="failed")
            self._commit_after = time.monotonic() + _COMMIT_RETRY_AFTER
            # Fenced: the partitions are revoked or lost next; never resent as it was.
            event(
                log,
                "commit_failed",
                level=logging.WARNING,
                why=why,
                offsets={str(p): o for p, o in sorted(offsets.items())},
                error=str(exc) or type(exc).__name__,
            )
            return
        self.metrics.inc("ingest_offset_commits_total", outcome="ok")
        for partition, offset in offsets.items():
            state = self.states.get(partition)
            if state is not None:
                state.committed = offset
        event(
            log,
            "offsets_committed",
            why=why,
            table_version=self.last_table_version,
            offsets={str(p): o for p, o in sorted(offsets.items())},
        )

    def _after_batch(self, batch: BatchThread, result: Any) -> None:
        self._commit_owned(batch.partitions)

    # -- ending ------------------------------------------------------------------------

    def _draining(self) -> bool:
        if self.stopping:
            return True
        return self.until_end and not any(s.live for s in self.states.values())

    def _settled(self, state: PartitionState) -> bool:
        if not (state.finished or state.failed) or len(state.pending):
            return False
        target = self._commit_target(state)
        return target is None or (state.committed is not None and state.committed >= target)

    def _finished(self) -> bool:
        if self.stopping:
            return self._shutdown_done() and not self.revocations
        if not self.until_end or not self.joined or self.batch is not None:
            return False
        if self.revocations or self.member.state is not MemberState.STABLE:
            return False
        return all(self._settled(s) for s in self.states.values())

    def _close_source(self, outcome_ok: bool) -> None:
        member = self.member
        if member is None:
            return
        # With a batch still in flight nothing more is committed: whoever takes over
        # lands its rows again, and the txn filter keeps each of them once.
        member.close(timeout=float(self.config.kafka.request_timeout) + 5)
        event(log, "left_group", group=self.group.group_id, static=self.group.is_static)

    def _source_status(self) -> dict[str, Any]:
        member = self.member
        if member is None:
            return {"group": self.group.group_id}
        status = member.status
        return {
            "group": self.group.group_id,
            "member_id": status.member_id,
            "generation": status.generation_id,
            "member_state": status.state.value,
        }
