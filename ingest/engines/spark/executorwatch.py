"""A batch on a Spark standalone cluster that has lost its executors for good.

A standalone master restarted without recovery mode (``spark.deploy.recoveryMode``) forgets
the applications it ran: when the workers register again, it has them kill the executors
of applications it does not know, and the driver, disconnected, logs "Waiting for
reconnection..." and waits for that master forever (measured on Spark 4.2: a batch of
``ingest run`` then hung with no executor and no error). ``ExecutorWatch`` turns that hang
into an error: a batch that has had no executor for ``[spark] executorless_timeout`` (60 s)
is cancelled, and ``SparkEngine.land`` raises ``SparkClusterLost``, which ends the run (exit 1) with
nothing of the batch committed; a rerun starts a new application and lands it exactly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from ingest.processes import start_thread

__all__ = ["ExecutorWatch"]

log = logging.getLogger("ingest.supervisor.spark")


class ExecutorWatch:
    """While a batch runs on a standalone cluster: cancels the session's jobs once it has
    had no executor (the driver aside) for ``timeout`` seconds; ``fired`` is then how long."""

    def __init__(self, session: Any, timeout: float, interval: float = 1.0) -> None:
        self.context = session.sparkContext
        self.timeout = timeout
        self.interval = interval
        self.fired: float | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def executors(self) -> int:
        """Executors registered with the driver now (its own entry left out)."""
        infos = self.context._jsc.sc().statusTracker().getExecutorInfos()
        return max(len(infos) - 1, 0)

    def _run(self) -> None:
        since: float | None = None
        while not self._done.wait(self.interval):
            try:
                count = self.executors()
            except Exception:  # the JVM is going: the batch meets the cause
                return
            now = time.monotonic()
            if count:
                since = None
                continue
            since = now if since is None else since
            if now - since >= self.timeout:
                self.fired = now - since
                log.error("no Spark executor for %.0fs: cancelling the batch's jobs", self.fired)
                with contextlib.suppress(Exception):
                    self.context.cancelAllJobs()
                return

    def __enter__(self) -> ExecutorWatch:
        self._thread = start_thread("executor-watch", self._run)
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)
