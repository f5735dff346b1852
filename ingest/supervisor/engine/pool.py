"""The worker pool: spawning one worker process per partition, pumping their events,
restarting crashed workers with backoff, retiring them, releasing their segments, and the
global buffer cap's pauses. The engine decides what the events mean (``on_event``)."""

from __future__ import annotations

import errno
import logging
import multiprocessing.connection
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ingest.config import WorkerSection
from ingest.errors import ConfigError, is_transient
from ingest.handoff import CorruptRangeReported, HandoffError, HandoffStore, SegmentSealed
from ingest.logs import event
from ingest.processes import BASE_FDS, FDS_PER_WORKER, open_files_limit, start_fork_server
from ingest.protocol.partition import Partition
from ingest.supervisor.engine.backpressure import CapDecision, GlobalBufferCap
from ingest.supervisor.engine.batches import Item, item_id
from ingest.supervisor.engine.partitions import Change, PartitionState
from ingest.supervisor.engine.wakeup import Wakeup
from ingest.supervisor.output.metrics import Metrics
from ingest.worker import Event, Release, WorkerHandle, WorkerSettings

__all__ = ["WorkerPool", "spawn_worker"]

log = logging.getLogger("ingest.supervisor")

_MAX_RESTART_BACKOFF = 60.0
# While riding out an outage: try again often enough to resume soon after it ends.
_MAX_TRANSIENT_BACKOFF = 10.0


def spawn_worker(settings: WorkerSettings) -> WorkerHandle:
    """Spawns a worker that ignores SIGINT: Ctrl-C reaches the whole process group, and
    stopping workers is the supervisor's business (a graceful stop seals their segments).
    Workers fork from the fork server, which ignores SIGINT from its start."""
    start_fork_server()
    try:
        return WorkerHandle.spawn(settings, ignore_sigint=True)
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        limit = open_files_limit()
        raise ConfigError(
            f"no file descriptor left to start the worker of {settings.topic}-"
            f"{settings.partition} ({exc.strerror}): this process may open {limit} files, "
            f"and each partition's worker takes about {FDS_PER_WORKER} here, plus "
            f"{BASE_FDS}; raise the limit (ulimit -n, systemd's LimitNOFILE) to at least "
            f"{BASE_FDS} + {FDS_PER_WORKER} x the partitions this supervisor may own",
            key="ulimit -n",
        ) from exc


class WorkerPool:
    """The workers of the engine's partitions (``states``, shared with the engine) and the
    retiring ones whose late segments are dropped."""

    def __init__(
        self,
        worker: WorkerSection,
        store: HandoffStore,
        cap: GlobalBufferCap,
        metrics: Metrics,
        states: dict[Partition, PartitionState],
        *,
        settings_for: Callable[[PartitionState], WorkerSettings],
        on_event: Callable[[PartitionState, Event], None],
        on_pause: Callable[[], None],
        engine_stopping: Callable[[], bool],
    ) -> None:
        self.worker = worker
        self.store = store
        self.cap = cap
        self.metrics = metrics
        self.states = states
        self.retiring: list[WorkerHandle] = []
        self._settings_for = settings_for
        self._on_event = on_event
        self._on_pause = on_pause
        self._engine_stopping = engine_stopping
        # Landed segments an unreachable object store did not let us delete yet: tried
        # again with the next release (deleting twice is harmless).
        self.unreleased: list[str] = []

    def close(self) -> None:
        for state in self.states.values():
            if state.handle is not None:
                state.handle.close(timeout=1.0)
                state.handle = None
        for handle in self.retiring:
            handle.close(timeout=1.0)
        self.retiring.clear()

    def spawn(self, state: PartitionState) -> None:
        state.handle = spawn_worker(self._settings_for(state))
        state.change(Change.SPAWN)
        if self.cap.paused:
            state.handle.pause()

    def live_handles(self) -> list[tuple[PartitionState | None, WorkerHandle]]:
        pairs: list[tuple[PartitionState | None, WorkerHandle]] = [
            (s, s.handle) for s in self.states.values() if s.handle is not None
        ]
        pairs += [(None, h) for h in self.retiring]
        return pairs

    def pump(self, timeout: float, wakeup: Wakeup | None = None) -> None:
        """Waits up to ``timeout`` for a worker's event or exit, or for ``wakeup`` (a
        thread's news), then handles what the workers sent."""
        pairs = self.live_handles()
        waitables: list[Any] = [] if wakeup is None else [wakeup]
        for _, handle in pairs:
            if not handle.events_closed:
                waitables.append(handle.connection)
            waitables.append(handle.sentinel)
        if waitables:
            multiprocessing.connection.wait(waitables, timeout)
        else:
            time.sleep(timeout)
        if wakeup is not None:
            wakeup.clear()
        for state, handle in pairs:
            events = handle.receive(0.0)
            if state is None:
                self.drop_items(
                    [e for e in events if isinstance(e, SegmentSealed | CorruptRangeReported)]
                )
                if handle.events_closed and not handle.alive:
                    handle.close(timeout=0.5)
                    self.retiring.remove(handle)
                continue
            for worker_event in events:
                self._on_event(state, worker_event)
            if handle.events_closed and not handle.alive:
                self.exited(state)

    def exited(self, state: PartitionState) -> None:
        handle = state.handle
        assert handle is not None
        state.handle = None
        reason = handle.exit_reason() or "ended"
        code = handle.exitcode
        handle.close(timeout=0.5)
        if state.stopping or state.finished or state.failed or self._engine_stopping():
            return
        # Its open segment cannot be sealed now: the next worker starts after the last
        # sealed one (a run with a kill every 2 minutes kept ~140 KB per kill until its end).
        mine = (state.partition.topic, state.partition.partition)
        if not any((h.settings.topic, h.settings.partition) == mine for h in self.retiring):
            self.store.drop_unsealed(state.partition.topic, state.partition.partition)
        offset = state.resume_offset if state.resume_offset is not None else -1
        crashes = state.crashes.get(offset, 0) + 1
        state.crashes[offset] = crashes
        labels: dict[str, object] = {
            "topic": state.partition.topic,
            "partition": state.partition.partition,
        }
        now = time.monotonic()
        transient = handle.last_error is not None and handle.last_error.transient
        if not transient:
            state.transient_since = None
        elif state.transient_since is None or state.transient_since[0] != offset:
            state.transient_since = (offset, now)
        # Unreachable storage or network: restarts go on past the count while
        # ``worker.retry_for`` lasts (an object store away for 30 s is ridden out).
        riding_out = state.transient_since is not None and now - state.transient_since[1] <= float(
            self.worker.retry_for
        )
        limit = int(self.worker.max_restarts_at_same_offset)
        if crashes > limit and not riding_out:
            state.change(
                Change.FAIL,
                failure=f"the worker crashed {crashes} times at offset {offset}, last: {reason}",
            )
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
        ceiling = _MAX_TRANSIENT_BACKOFF if riding_out else _MAX_RESTART_BACKOFF
        delay = min(float(self.worker.restart_backoff) * 2 ** (crashes - 1), ceiling)
        state.change(Change.CRASH)
        state.restart_at = now + delay
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

    def restart_due(self) -> None:
        now = time.monotonic()
        for state in self.states.values():
            if (
                state.restart_at is not None
                and now >= state.restart_at
                and state.handle is None
                and not state.failed
                and not state.stopping
            ):
                self.spawn(state)

    def retire(self, state: PartitionState) -> None:
        """Stops the worker at once; its late segments are dropped when they arrive."""
        if state.handle is not None:
            state.handle.stop_now(wait=None)
            self.retiring.append(state.handle)
            state.handle = None
        state.change(Change.STOP)

    def apply_cap(self, decision: CapDecision | None) -> None:
        if decision is None:
            return
        pause = decision is CapDecision.PAUSE_ALL
        if pause:
            self._on_pause()
        event(log, "buffer_cap", paused=pause, held_bytes=self.cap.held_bytes)
        for state in self.states.values():
            if state.handle is not None:
                if pause:
                    state.handle.pause()
                else:
                    state.handle.resume()

    def release(self, items: Mapping[Partition, Iterable[Item]]) -> None:
        for partition, chosen in items.items():
            chosen = list(chosen)
            if not chosen:
                continue
            ids = [item_id(i) for i in chosen]
            self._delete(ids)
            state = self.states.get(partition)
            if state is not None and state.handle is not None:
                state.handle.send(Release(tuple(ids)))
            self.apply_cap(self.cap.released(partition, sum(i.bytes for i in chosen)))

    def _delete(self, ids: list[str]) -> None:
        """Deletes the segments; on an object store that does not answer, keeps them for
        the next release instead (they are landed: only their space is at stake)."""
        wanted = [*self.unreleased, *ids]
        try:
            self.store.release(wanted)
        except HandoffError as exc:
            if self.store.location.local or not is_transient(exc):
                raise
            self.unreleased = wanted
            event(
                log, "release_deferred", level=logging.WARNING, segments=len(wanted), error=str(exc)
            )
            return
        self.unreleased = []

    def drop_items(self, items: list[Any]) -> None:
        by_partition: dict[Partition, list[Item]] = {}
        for item in items:
            by_partition.setdefault(Partition(item.topic, item.partition), []).append(item)
        for partition, chosen in by_partition.items():
            self.apply_cap(self.cap.sealed(partition, sum(i.bytes for i in chosen)))
        self.release(by_partition)

    def abandon_pending(self, state: PartitionState) -> None:
        self.release({state.partition: state.pending.clear()})
