"""Worker processes: one per partition, spawned, controlled over pipes.

``WorkerHandle.spawn(settings)`` starts a process with multiprocessing's
"forkserver" context: a fork of a server that is itself a fresh interpreter
holding nothing but this module's imports, never a fork of a parent that may
hold a Spark context, sockets or threads. A worker then starts in ~10 ms
instead of paying ~0.4 CPU s of imports each (``ingest.processes.start_fork_server`` starts it
early, while the supervisor is still joining). Two one-way pipes connect them: controls
down (``Pause``, ``Resume``, ``StopAfterSeal``, ``StopNow``, ``Release``),
events up (``WorkerStarted``, ``SegmentSealed``, ``CorruptRangeReported``,
``OffsetResetApplied``, ``BackpressureChanged``, ``WorkerFinished``,
``WorkerFailed``).

In the worker a small control thread reads the control pipe, so controls are
seen even while the loop is blocked in a Fetch. ``StopNow`` (or the parent
going away: end of file on the pipe) makes the loop drop its open segment and
exit; if the loop has not finished within ``STOP_NOW_GRACE`` seconds, the
thread removes the partial file and ends the process itself, so a worker
always exits within a second of being told to.

Exit codes: 0 finished or stopped as asked; 1 failed (a ``WorkerFailed``
event was sent first); 3 the parent went away; negative: killed by that signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any, Self

from ingest.client.cluster import Cluster
from ingest.errors import is_transient
from ingest.handoff.segment import SegmentWriter
from ingest.handoff.store import HandoffStore
from ingest.logs import configure_logging
from ingest.processes import fork_context, start_thread
from ingest.protocol.recordbatch import _records
from ingest.worker.fetcher import PartitionFetcher
from ingest.worker.loop import ControlInbox, PartitionWorker
from ingest.worker.parent_messages import (
    Control,
    Event,
    Pause,
    Release,
    Resume,
    StopAfterSeal,
    StopNow,
    WorkerFailed,
    WorkerFinished,
)
from ingest.worker.settings import WorkerSettings

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARENT_GONE",
    "STOP_NOW_GRACE",
    "WORKER_PROCESS_NAME",
    "WorkerHandle",
    "worker_main",
]

log = logging.getLogger("ingest.worker")

WORKER_PROCESS_NAME = "ingest-worker"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PARENT_GONE = 3
# How long the loop gets to stop by itself before the control thread ends the process.
STOP_NOW_GRACE = 0.6


# -- the worker's side ------------------------------------------------------------------


class _Child:
    """State the control thread shares with the main thread of a worker process."""

    def __init__(self) -> None:
        self.inbox = ControlInbox()
        self.done = threading.Event()
        self.parent_gone = threading.Event()
        self.writer: SegmentWriter | None = None

    def control_loop(self, control: Connection) -> None:
        while True:
            try:
                message = control.recv()
            except (EOFError, OSError):
                self.parent_gone.set()
                self.inbox.put(StopNow())
                self._exit_unless_done(EXIT_PARENT_GONE)
                return
            self.inbox.put(message)
            if isinstance(message, StopNow):
                self._exit_unless_done(EXIT_OK)
                return

    def _exit_unless_done(self, code: int) -> None:
        if self.done.wait(STOP_NOW_GRACE):
            return
        # The loop is stuck (a Fetch, an upload): drop the partial segment and go.
        writer = self.writer
        path = writer.temporary_path if writer is not None else None
        if path is not None and writer is not None and writer.location.local:
            with contextlib.suppress(OSError):
                os.unlink(path)
        os._exit(code)


def _configure_logging(settings: WorkerSettings) -> None:
    configure_logging(
        settings.log_format,
        settings.log_level.lower(),
        sys.stderr,
        context={"topic": settings.topic, "partition": settings.partition, "pid": os.getpid()},
    )


def worker_main(
    settings: WorkerSettings, control: Connection, events: Connection, ignore_sigint: bool = False
) -> None:
    """The worker process's entry point (a module-level function, so spawn can find it)."""
    # Forked workers share the fork server's command line; the name tells them apart in
    # ps -o comm, top and the fault tests.
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(WORKER_PROCESS_NAME)
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _configure_logging(settings)
    child = _Child()
    start_thread("worker-control", child.control_loop, control)  # ends with the control pipe

    def emit(event: Event) -> None:
        events.send(event)

    if settings.decode_buffer_cache_bytes is not None:
        _records.set_buffer_cache(settings.decode_buffer_cache_bytes)
    code = EXIT_OK
    try:
        with Cluster(settings.client) as cluster:
            fetcher = PartitionFetcher(
                cluster,
                settings.topic,
                settings.partition,
                settings.fetch,
                start=settings.start,
                end=settings.end,
                sleep=child.inbox.wait,  # a backoff wait ends early for a control
            )
            writer = SegmentWriter(settings.handoff, settings.topic, settings.partition)
            if settings.segment_max_bytes is not None:
                writer.segment_max_bytes = settings.segment_max_bytes
            child.writer = writer
            worker = PartitionWorker(
                fetcher,
                writer,
                emit,
                child.inbox,
                max_unacked_bytes=settings.max_unacked_bytes,
                resume_unacked_bytes=settings.resume_unacked_bytes,
            )
            try:
                worker.run()
            finally:
                writer.abort()  # nothing open after a clean end; a partial file otherwise
    except BaseException as exc:
        if child.parent_gone.is_set():
            code = EXIT_PARENT_GONE
        else:
            code = EXIT_FAILED
            log.exception("worker failed")
            with contextlib.suppress(Exception):
                emit(
                    WorkerFailed(
                        topic=settings.topic,
                        partition=settings.partition,
                        error_type=type(exc).__name__,
                        message=str(exc),
                        traceback="".join(traceback.format_exception(exc)),
                        transient=is_transient(exc),
                    )
                )
    finally:
        child.done.set()
        with contextlib.suppress(OSError):
            events.close()
    if child.parent_gone.is_set():
        code = EXIT_PARENT_GONE
    sys.exit(code)


# -- the parent's side ------------------------------------------------------------------


class WorkerHandle:
    """The parent's handle on one worker process."""

    def __init__(
        self,
        settings: WorkerSettings,
        process: Any,
        control: Connection,
        events: Connection,
        store: HandoffStore | None,
    ) -> None:
        self.settings = settings
        self.process = process
        self._control = control
        self._events = events
        self.store = store
        self.last_error: WorkerFailed | None = None
        self.finished: WorkerFinished | None = None
        self.events_closed = False

    @classmethod
    def spawn(
        cls,
        settings: WorkerSettings,
        *,
        store: HandoffStore | None = None,
        ignore_sigint: bool = False,
    ) -> Self:
        """Starts a worker process for ``settings`` (a fork of the fork server)."""
        context = fork_context()
        control_reader, control_writer = context.Pipe(duplex=False)
        events_reader, events_writer = context.Pipe(duplex=False)
        process = context.Process(
            target=worker_main,
            args=(settings, control_reader, events_writer, ignore_sigint),
            name=f"ingest-worker-{settings.topic}-{settings.partition}",
            daemon=True,
        )
        process.start()
        # Only the child keeps these ends, so either side sees the other's death as EOF.
        control_reader.close()
        events_writer.close()
        return cls(settings, process, control_writer, events_reader, store)

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"exit {self.exitcode}"
        return f"WorkerHandle({self.settings.topic}/{self.settings.partition}, pid {self.pid}, {state})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- state --------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid

    @property
    def alive(self) -> bool:
        return bool(self.process.is_alive())

    @property
    def exitcode(self) -> int | None:
        code: int | None = self.process.exitcode
        return code

    @property
    def sentinel(self) -> int:
        """Readable once the process has ended (for ``multiprocessing.connection.wait``)."""
        sentinel: int = self.process.sentinel
        return sentinel

    @property
    def connection(self) -> Connection:
        """The events pipe (for ``multiprocessing.connection.wait`` over many workers)."""
        return self._events

    def exit_reason(self) -> str | None:
        """Why the process ended, in words; None while it runs."""
        code = self.exitcode
        if code is None:
            return None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name} (exit code {code})"
        if code == EXIT_OK:
            return "exited normally (exit code 0)"
        if code == EXIT_PARENT_GONE:
            return "exited because its parent went away (exit code 3)"
        if self.last_error is not None:
            return (
                f"failed with {self.last_error.error_type}: {self.last_error.message} "
                f"(exit code {code})"
            )
        return f"exited with code {code} without reporting an error"

    # -- controls -----------------------------------------------------------------------

    def send(self, control: Control) -> bool:
        """Sends a control; False when the worker is gone."""
        try:
            self._control.send(control)
        except (OSError, ValueError):
            return False
        return True

    def pause(self) -> bool:
        return self.send(Pause())

    def resume(self) -> bool:
        return self.send(Resume())

    def stop_after_seal(self) -> bool:
        return self.send(StopAfterSeal())

    def stop_now(self, *, wait: float | None = 1.0) -> int | None:
        """Tells the worker to exit at once; waits up to ``wait`` s; returns the exit code."""
        self.send(StopNow())
        if wait is None:
            return self.exitcode
        return self.join(wait)

    def release(self, item_ids: Iterable[str]) -> None:
        """Deletes durable segments (through the store, if given) and tells the worker, whose
        backpressure counts them no more."""
        ids = tuple(item_ids)
        if self.store is not None:
            self.store.release(ids)
        self.send(Release(ids))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.pid is not None and self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    # -- events -------------------------------------------------------------------------

    def receive(self, timeout: float | None = 0.0) -> list[Event]:
        """Every event available, waiting up to ``timeout`` s (None: forever) for the first."""
        received: list[Event] = []
        if self.events_closed:
            return received
        wait = timeout
        try:
            while self._events.poll(wait):
                event = self._events.recv()
                received.append(event)
                if isinstance(event, WorkerFailed):
                    self.last_error = event
                elif isinstance(event, WorkerFinished):
                    self.finished = event
                wait = 0.0
        except (EOFError, OSError):
            self.events_closed = True
        return received

    def join(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.exitcode

    def close(self, *, timeout: float = 2.0) -> None:
        """Stops the worker if it still runs (stop-now, then SIGKILL) and closes the pipes."""
        if self.alive:
            self.stop_now(wait=timeout)
        if self.alive:
            self.kill()
            self.join(timeout)
        for connection in (self._control, self._events):
            with contextlib.suppress(OSError):
                connection.close()
