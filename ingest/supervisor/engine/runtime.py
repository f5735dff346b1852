"""``Engine``: the main loop that ``ingest run`` and ``ingest replay`` share (this package's
docstring tells the loop), and what follows each batch: landed or failed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ingest.client import Cluster
from ingest.config import IngestConfig
from ingest.engines.landing import choose_engine, resolve_names
from ingest.errors import ConfigError, IngestError, SparkClusterLost, SparkStartError
from ingest.faults import fault_point
from ingest.handoff import HandoffStore, SegmentSealed
from ingest.logs import event
from ingest.processes import raise_open_files_limit, start_fork_server
from ingest.protocol.partition import Partition
from ingest.sink.batch import BatchResult
from ingest.supervisor.engine.backpressure import GlobalBufferCap
from ingest.supervisor.engine.batcher import Batcher, owner_of
from ingest.supervisor.engine.batches import BatchThread, Item, item_next_offset
from ingest.supervisor.engine.handoff_space import HandoffSpace
from ingest.supervisor.engine.intake import Intake
from ingest.supervisor.engine.maintainer import TableMaintainer, check_tables
from ingest.supervisor.engine.partitions import Change, PartitionState
from ingest.supervisor.engine.pool import WorkerPool
from ingest.supervisor.engine.retries import classify
from ingest.supervisor.engine.source import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, RunOutcome, Source
from ingest.supervisor.engine.wakeup import Wakeup
from ingest.supervisor.output.metrics import Metrics, MetricsServer
from ingest.supervisor.output.status import collect_lag
from ingest.supervisor.wiring import (
    client_config,
    fetch_settings,
    handoff_config,
    latest_key_schema,
    latest_value_schema,
    table_router,
    wanted_space,
    worker_settings,
)
from ingest.worker import EndPosition, StartPosition, WorkerSettings

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "Engine", "RunOutcome"]

log = logging.getLogger("ingest.supervisor")


_LOOP_WAIT = 0.05
_STATUS_EVERY = 0.5


class Engine:
    """Workers, batches, releases, restarts, shutdown, for the partitions its ``source``
    (the group, or a replay) owns."""

    def __init__(
        self,
        config: IngestConfig,
        source: Callable[[Engine], Source],
        *,
        spark: Any | None = None,
        metrics: Metrics | None = None,
        maintenance: bool = False,
        overwrite: bool = False,  # replay --overwrite: the tables' cut picks the engine too
    ) -> None:
        # A table by name: the catalog places it first (the Spark engine, started now).
        config, named = resolve_names(config, spark)
        self.config = config
        self.client = client_config(config)
        self.router = table_router(
            config,
            value_registered=latest_value_schema(config),
            key_registered=latest_key_schema(config),
        )
        self.table = self.router.default
        self.fetch = fetch_settings(config)
        self.lander = named or choose_engine(
            config.spark,
            spark,
            transform=bool(config.table.transform),
            storage_options=config.table_storage_options(),
            table=self.table,
            tables=self.router.tables(),
            overwrite=overwrite,
        )
        maintainer = TableMaintainer(config, self.lander.table_maintenance)  # maintainer.py
        self.maintainer = maintainer if maintenance else None  # between batches (ingest run)
        self.metrics = metrics or Metrics()
        self.states: dict[Partition, PartitionState] = {}
        wanted = wanted_space(config)
        self.cap = GlobalBufferCap(wanted.max_buffered_bytes, wanted.max_buffered_bytes // 2)
        self.store = HandoffStore(handoff_config(config))
        if config.handoff.mode == "shm" and not config.spark.master.startswith("local"):
            event(
                log,
                "handoff_shm_with_cluster",
                level=logging.WARNING,
                master=config.spark.master,
                reason="segments in this host's /dev/shm: executors on other hosts cannot "
                'read them; set handoff.mode = "files" with a root every executor reaches',
            )
        self.space = HandoffSpace(wanted, self.store, self.cap)
        self.wakeup = Wakeup()
        self.batcher = Batcher(
            config.trigger,
            self.router,
            self.lander,
            self.store,
            self.cap,
            self.wakeup.set,
            on_new_table=self._new_table,
        )
        self.rows_written = 0
        self.last_table_version: int | None = None
        self._incarnation = 0
        self.pool = WorkerPool(
            config.worker,
            self.store,
            self.cap,
            self.metrics,
            self.states,
            settings_for=self._worker_settings,
            on_event=lambda state, message: self.intake.on_event(state, message),
            on_pause=self._request_flush,
            engine_stopping=lambda: self.stopping,
        )
        self._stop_requested = threading.Event()
        self._stop_reason = ""
        self.stopping = False
        self._deadline = float("inf")
        self._status_at = 0.0
        self._metrics_server: MetricsServer | None = None
        self.cluster: Cluster | None = None
        self.source = source(self)
        self.intake = Intake(
            self.source,
            self.pool,
            self.cap,
            self.metrics,
            request_flush=self._request_flush,
            warm_spark=self.lander.warm,
        )
        self._status: dict[str, Any] = {"mode": self.source.mode, "partitions": []}

    # -- public ------------------------------------------------------------------------

    @property
    def batch(self) -> BatchThread | None:
        """The batch in flight, if any."""
        return self.batcher.running

    @property
    def batches(self) -> int:
        return self.batcher.count

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
                if self.source.finished():
                    break
            return self.source.complete()
        except ConfigError as exc:
            event(log, "run_failed", level=logging.ERROR, error=str(exc))
            return self._outcome(EXIT_CONFIG, str(exc))
        except IngestError as exc:
            event(log, "run_failed", level=logging.ERROR, error=str(exc))
            return self._outcome(EXIT_FAILED, str(exc))
        finally:
            self._close()

    def complete(self) -> RunOutcome:
        """The usual outcome: 1 when a partition failed, else 0."""
        failed = self._failed()
        if failed:
            text = "; ".join(f"{p}: {why}" for p, why in sorted(failed.items()))
            return self._outcome(EXIT_FAILED, f"{len(failed)} partition(s) failed: {text}")
        return self._outcome(EXIT_OK, "done")

    # -- the loop ----------------------------------------------------------------------

    def _open(self) -> None:
        self.store.open()
        self.space.measure()  # refuses a handoff too small for even one partition
        # One worker per partition: four descriptors each (ingest/processes.py).
        log.debug("open files limit: %d", raise_open_files_limit())
        start_fork_server()  # imports in the background while we join or list offsets
        listen = self.config.metrics.listen
        if listen:
            self._metrics_server = MetricsServer(
                self.metrics,
                listen,
                status=self.status if self.config.metrics.status else None,
                collector=self._collect_lag,
            )
            event(log, "metrics_listening", address=self._metrics_server.address)
        check_tables(self.config)  # txn entries that expire: refused (exit 2)
        self.cluster = Cluster(self.client)
        self.source.start()

    def _step(self) -> None:
        # The wait first: a thread's news (a commit's outcome) is acted on in this step, not
        # after one more wait (the last commit's outcome sat 50 ms before the run could end).
        self.pool.pump(_LOOP_WAIT, self.wakeup)
        self.source.poll()
        self.pool.restart_due()
        if self.batch is not None and self.batch.done():
            self._finish_batch()
        self.source.after_step()
        if self.batcher.due(self.states, draining=self.source.draining()):
            self.batcher.start(self.states, overwrite=self.source.overwrite)
        if self.maintainer is not None and not self.stopping:
            self.maintainer.step(batch_running=self.batch is not None)
        self._publish_status()

    def _new_table(self, topic: str) -> None:
        """A ``{topic}`` table about to take its first batch of this run: refused as at
        the start when it cannot be written (exit 2), then kept by maintenance."""
        check_tables(self.config, topics=[topic])
        if self.maintainer is not None:
            self.maintainer.topics.add(topic)

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
        self.pool.close()
        try:
            self.source.close(not running)
        except IngestError as exc:
            event(log, "leave_failed", level=logging.WARNING, error=str(exc))
        if self.cluster is not None:
            self.cluster.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self.maintainer is not None:
            self.maintainer.close()
        if not running:
            self.store.close()
            self.lander.stop()
        self.wakeup.close()

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
            state.change(Change.STOP)
            if state.handle is not None:
                state.handle.stop_after_seal()

    def shutdown_done(self) -> bool:
        return (
            self.batch is None
            and not any(s.live for s in self.states.values())
            and not any(len(s.pending) for s in self.states.values())
        )

    def _deadline_passed(self) -> RunOutcome:
        waiting = []
        if self.batch is not None:
            waiting.append("a batch was not durable")
        live = sorted(str(s.partition) for s in self.states.values() if s.live)
        if live:
            waiting.append(f"workers still ran ({', '.join(live)})")
        pending = sorted(str(s.partition) for s in self.states.values() if len(s.pending))
        if pending:
            waiting.append(f"segments were not landed ({', '.join(pending)})")
        what = "; ".join(waiting) or "the group did not take the last offset commits"
        message = (
            f"the shutdown deadline ({float(self.config.trigger.shutdown_timeout):g}s) passed: "
            f"{what}; what was not committed is read again on the next run"
        )
        event(log, "shutdown_deadline_passed", level=logging.ERROR)
        for state in self.states.values():
            if state.handle is not None:
                state.handle.stop_now(wait=None)
        return self._outcome(EXIT_FAILED, message)

    # -- workers -----------------------------------------------------------------------

    def new_state(
        self, partition: Partition, start: StartPosition, end: EndPosition | None
    ) -> PartitionState:
        self._incarnation += 1
        state = PartitionState(partition, self._incarnation, start, end)
        self.states[partition] = state
        self.metrics.partition_assigned(partition)
        self.metrics.set("ingest_partitions_assigned", len(self.states))  # not at the next status
        return state

    def _worker_settings(self, state: PartitionState) -> WorkerSettings:
        start = (
            StartPosition.offset(state.resume_offset)
            if state.resume_offset is not None
            else state.start
        )
        return worker_settings(
            self.config,
            self.client,
            self.fetch,
            self.store.location,
            state.partition,
            start,
            state.end,
            self.space.plan,
        )

    def _request_flush(self) -> None:
        self.batcher.flush = True  # the cap paused every worker: land what is held

    # The pool's verbs, as the modes use them.
    def spawn(self, state: PartitionState) -> None:
        self._fit_space(extra=state)
        self.pool.spawn(state)

    def retire(self, state: PartitionState) -> None:
        self.pool.retire(state)
        self._fit_space()

    def _fit_space(self, extra: PartitionState | None = None) -> None:
        """Plans the handoff for the partitions with a worker (and ``extra``, about to get
        one); raises HandoffTooSmall when they cannot all have a segment."""
        held = [s for s in self.states.values() if s.handle is not None]
        count = len(held) + (1 if extra is not None and extra.handle is None else 0)
        _, decision = self.space.fit(count, (s.handle for s in held if s.handle is not None))
        self.pool.apply_cap(decision)

    def abandon_pending(self, state: PartitionState) -> None:
        self.pool.abandon_pending(state)

    # -- batches -----------------------------------------------------------------------

    def default_draining(self) -> bool:
        """Everything pending should land now (no more is coming soon)."""
        return self.stopping or not any(s.live for s in self.states.values())

    def _finish_batch(self) -> None:
        batch = self.batcher.running
        assert batch is not None
        self.batcher.running = None
        result, error = batch.outcome()
        seconds = time.monotonic() - batch.started
        if error is not None:
            self._batch_failed(batch, error, seconds)
        else:
            self._batch_landed(batch, result, seconds)

    def _batch_landed(self, batch: BatchThread, result: BatchResult, seconds: float) -> None:
        self.batcher.landed(seconds, batch.selection.bytes)
        self.last_table_version = result.table_version
        self.rows_written += result.rows_written
        for stage, spent in result.stage_seconds.items():
            self.metrics.observe("ingest_batch_stage_seconds", spent, stage=stage)
        self.metrics.inc("ingest_batches_total", outcome="ok")
        self.metrics.inc("ingest_rows_written_total", result.rows_written)
        self.metrics.inc("ingest_dead_letters_total", result.dead_letters)
        for partition, items in batch.selection.items.items():
            state = owner_of(self.states, batch, partition)
            if state is None:
                continue
            durable = result.durable_offsets.get(partition)
            if durable is not None:
                state.durable_next = max(durable + 1, state.durable_next or 0)
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
        self.source.after_batch(batch, result)
        self.pool.release(batch.selection.items)

    def _batch_failed(self, batch: BatchThread, error: BaseException, seconds: float) -> None:
        self.metrics.inc("ingest_batches_total", outcome="failed")
        if isinstance(error, ConfigError):
            raise error
        jvm_exit = self.lander.jvm_exit_code()
        failure = classify(
            error,
            jvm_exited=jvm_exit is not None,
            cluster_lost=isinstance(error, SparkClusterLost),
            spark_start=isinstance(error, SparkStartError),
        )
        now = time.monotonic()
        retry = self.batcher.retry
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
            state = owner_of(self.states, batch, partition)
            if state is None or state.abandon:
                abandoned[partition] = items
            else:
                state.pending.put_back(items, now)
        self.pool.release(abandoned)
        if delay is not None:
            return
        raise retry.final_error(failure, batch.number, error, jvm_exit, now) from error

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
            if state.durable_next is not None:  # the metric is the last durable offset
                durable = state.durable_next - 1
                self.metrics.set("ingest_partition_durable_offset", durable, **labels)
            partitions.append(state.row())
        self.metrics.retain_partitions(self.states)
        self.metrics.set("ingest_partitions_assigned", len(self.states))
        self.metrics.set("ingest_buffered_bytes", self.cap.held_bytes)
        self._status = {
            "mode": self.source.mode,
            "stopping": self.stopping,
            "batches": self.batches,
            "batch_running": self.batch is not None,
            "rows_written": self.rows_written,
            "table_version": self.last_table_version,
            **self.source.status(),
            "partitions": partitions,
        }

    def _collect_lag(self, metrics: Metrics) -> None:
        """At scrape time, on the metrics thread: end offsets of the owned partitions."""
        collect_lag(metrics, self._status.get("partitions", []), self.client, self.fetch)
