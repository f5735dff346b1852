"""The Spark JVM's output as records of this process's log.

The JVM writes log4j console lines (``26/11/22 02:49:15 WARN Utils: ...``), its own
warnings, and the stderr of Spark's Python workers, which Spark forwards. Left on
the supervisor's stderr they break the one-format log that ``[logging] format``
promises. ``JvmOutputRelay`` gives the JVM a pipe for stdout and stderr; a thread
reads it and logs each record under ``spark.<log4j logger>`` (``spark.jvm`` for
lines of no logger) at its log4j level. A stack trace or a traceback stays one
record: lines join the record before them until a new log4j header, or until the
pipe has been quiet for ``QUIET_SECONDS``.

``JvmLineAssembler`` is the pure part: lines in, records out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import threading
from dataclasses import dataclass

__all__ = ["QUIET_SECONDS", "JvmLineAssembler", "JvmOutputRelay", "JvmRecord"]

QUIET_SECONDS = 0.1

# Spark's default log4j2 pattern: %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
_HEADER = re.compile(
    r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ([^\s:]+): ?(.*)$"
)
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
# Lines with no log4j header: the JVM's and Python's own words say how bad they are.
_BARE_LEVELS = (
    ("Traceback (most recent call last)", logging.ERROR),
    ("Exception in thread", logging.ERROR),
    ("ERROR", logging.ERROR),
    ("Error", logging.ERROR),
    ("WARNING", logging.WARNING),
    ("Warning", logging.WARNING),
)


@dataclass(frozen=True, slots=True)
class JvmRecord:
    level: int
    source: str  # log4j's logger (its last name part), or "jvm"
    text: str


class JvmLineAssembler:
    """Joins the JVM's output lines into records (see the module doc)."""

    def __init__(self) -> None:
        self._level = logging.INFO
        self._source = ""
        self._lines: list[str] = []

    def feed(self, line: str) -> list[JvmRecord]:
        line = line.rstrip("\r\n")
        header = _HEADER.match(line)
        if header is not None:
            done = self.flush()
            self._level = _LEVELS[header.group(1)]
            self._source = header.group(2)
            self._lines = [header.group(3)]
            return done
        if not self._lines:
            if not line.strip():
                return []
            self._level = next(
                (level for prefix, level in _BARE_LEVELS if line.startswith(prefix)),
                logging.INFO,
            )
            self._source = "jvm"
        self._lines.append(line)
        return []

    def flush(self) -> list[JvmRecord]:
        if not self._lines:
            return []
        record = JvmRecord(self._level, self._source, "\n".join(self._lines).rstrip())
        self._lines = []
        return [record]


class JvmOutputRelay:
    """A pipe for a JVM's stdout and stderr, read on a daemon thread into the log.

    Give ``write_fd`` to the JVM's ``Popen`` (as stdout, stderr to stdout), then call
    ``launched()`` so that only the JVM and its children hold the write end: the
    thread ends when they have all exited.
    """

    def __init__(self, logger_prefix: str = "spark") -> None:
        self._read_fd, self.write_fd = os.pipe()
        self._prefix = logger_prefix
        self._assembler = JvmLineAssembler()
        self._thread = threading.Thread(target=self._run, name="ingest-jvm-output", daemon=True)
        self._thread.start()

    def launched(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.write_fd)

    def join(self, timeout: float) -> bool:
        """Waits for the JVM's output to end; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([self._read_fd], [], [], QUIET_SECONDS)
                if not ready:
                    self._log(self._assembler.flush())
                    continue
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._log(self._assembler.feed(line.decode("utf-8", "replace")))
        finally:
            if pending:
                self._log(self._assembler.feed(pending.decode("utf-8", "replace")))
            self._log(self._assembler.flush())
            with contextlib.suppress(OSError):
                os.close(self._read_fd)

    def _log(self, records: list[JvmRecord]) -> None:
        for record in records:
            logging.getLogger(f"{self._prefix}.{record.source}").log(record.level, record.text)
