"""The supervisor's Spark session, started in the background on first need.

A local session takes 7-10 s to start (the JVM); the supervisor starts it on a
thread as soon as it knows a batch will come, so the start overlaps joining
the group and fetching, then runs an empty job through the segment source so
the first batch finds the Python workers up. A run with nothing to land never
starts a JVM.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from ingest.config import SparkSection
from ingest.errors import SinkError

__all__ = ["SparkProvider", "start_session"]

log = logging.getLogger("ingest.supervisor.spark")


def start_session(section: SparkSection) -> Any:
    """Starts (or returns) this process's session with ingest's settings and ``[spark]``."""
    # Python workers must run this interpreter (pyarrow and ingest are installed here).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(section.master)
        .appName(section.app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Spark 4 writes INT96 timestamps by default; Delta readers want micros.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    )
    for key, value in section.conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


class SparkProvider:
    """One session, given (tests) or started on a background thread (``warm``)."""

    def __init__(
        self, section: SparkSection, session: Any | None = None, *, transform: bool = False
    ) -> None:
        self.section = section
        self.transform = transform  # batches will go through Spark SQL (the data source)
        self._session = session
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._owned = session is None
        self.started_in: float | None = None

    @property
    def started(self) -> bool:
        return self._session is not None or self._thread is not None

    def warm(self) -> None:
        """Starts the session in the background (once)."""
        if self._session is not None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._start, name="ingest-spark-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        began = time.monotonic()
        try:
            session = start_session(self.section)
            self.started_in = time.monotonic() - began
            log.info("spark session %s started in %.1fs", self.section.master, self.started_in)
            if self._owned:
                self._warm_up(session, self.transform)
            self._session = session
        except BaseException as exc:
            self._error = exc

    @staticmethod
    def _warm_up(session: Any, transform: bool) -> None:
        """An empty job the way batches run (spark_jobs.job.warm_up): the first batch no
        longer pays for the Python workers' start and imports."""
        from spark_jobs.job import warm_up

        try:
            log.info("spark warm-up job took %.1fs", warm_up(session, transform=transform))
        except Exception as exc:  # the first batch will meet the cause, with its context
            log.warning("spark warm-up job failed: %s", exc)

    def session_if_started(self) -> Any | None:
        """The session if it is up, without waiting or starting one."""
        return self._session

    def get(self) -> Any:
        """The session, waiting for its start."""
        self.warm()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise SinkError(f"the Spark session did not start: {self._error}") from self._error
        assert self._session is not None
        return self._session

    def stop(self) -> None:
        """Stops a session this provider started (a given one belongs to the caller)."""
        if self._owned and self._session is not None:
            try:
                self._session.stop()
            except Exception as exc:
                log.warning("stopping the Spark session failed: %s", exc)
            self._session = None
