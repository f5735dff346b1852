"""The Spark JVM's output as records of this process's log.

The JVM writes log4j console lines (``26/11/22 02:49:15 WARN Utils: ...``), its own
warnings and errors, and the stderr of Spark's Python workers, which Spark
forwards. Left on the supervisor's stderr they break the one-format log that
``[logging] format`` promises. ``JvmOutputRelay`` gives the JVM a pipe for stdout
and stderr; a thread reads it and logs each record under ``spark.<log4j logger>``
(``spark.jvm`` for lines of no logger) at its log4j level.

A stack trace stays with the line it explains: indented lines, ``Caused by:``,
``... n more``, a Java exception's first line (``java.lang.X: ...``) and the last
line of a Python traceback join the record before them. Any other line starts a
record; without a log4j header its own words give its level (``Error: ...``,
``WARNING: ...``, ``Traceback ...``). A few warnings every local JVM gives (no
native Hadoop library, a loopback hostname) are logged at info.

``JvmLineAssembler`` is the pure part: lines in, records out.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import selectors
import threading
from collections import deque
from dataclasses import dataclass

from ingest.processes import start_thread

__all__ = ["QUIET_SECONDS", "JvmLineAssembler", "JvmOutputRelay", "JvmRecord"]

# A record is complete once the pipe has been quiet this long.
QUIET_SECONDS = 0.1
# A line longer than this is logged in pieces.
MAX_LINE_BYTES = 1 << 20
# The JVM blocks in log4j when the pipe is full: room for bursts while the GIL is busy.
PIPE_BYTES = 1 << 20

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
# java.lang.IllegalStateException: ..., org.apache.spark.SparkException
_JAVA_THROWABLE = re.compile(r"^[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)+(: .*)?$")
_CONTINUATION_PREFIXES = ("Caused by:", "Suppressed:", "...")
_TRACEBACK = "Traceback (most recent call last)"
_BARE_LEVELS = (
    (_TRACEBACK, logging.ERROR),
    ("Exception in thread", logging.ERROR),
    ("Unrecognized", logging.ERROR),
    ("Improperly specified", logging.ERROR),
    ("ERROR", logging.ERROR),
    ("Error", logging.ERROR),
    ("WARNING", logging.WARNING),
    ("Warning", logging.WARNING),
)


# Warnings every local JVM gives and nobody acts on: logged at info, so that a warning
# in the log means something to do.
_ROUTINE_WARNINGS = (
    "WARNING: Using incubator modules",
    "Unable to load native-hadoop library",
    "Your hostname, ",  # "... resolves to a loopback address: ...; using ... instead"
    "Set SPARK_LOCAL_IP if you need to bind to another address",
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
        if not line.strip():
            return []
        if self._lines and self._continues(line):
            self._lines.append(line)
            if self._lines[0].startswith(_TRACEBACK) and not line[0].isspace():
                return self.flush()  # "ValueError: ..." ends a Python traceback
            return []
        done = self.flush()
        self._level = next(
            (level for prefix, level in _BARE_LEVELS if line.startswith(prefix)), logging.INFO
        )
        self._source = "jvm"
        self._lines = [line]
        return done

    def _continues(self, line: str) -> bool:
        if line[0].isspace() or line.startswith(_CONTINUATION_PREFIXES):
            return True
        if self._lines[0].startswith(_TRACEBACK):
            return True  # the exception line that ends it
        return _JAVA_THROWABLE.match(line) is not None

    def flush(self) -> list[JvmRecord]:
        if not self._lines:
            return []
        text = "\n".join(self._lines).rstrip()
        level = self._level
        if level == logging.WARNING and text.startswith(_ROUTINE_WARNINGS):
            level = logging.INFO
        self._lines = []
        return [JvmRecord(level, self._source, text)]


class JvmOutputRelay:
    """A pipe for a JVM's stdout and stderr, read on a daemon thread into the log.

    Give ``write_fd`` to the JVM's ``Popen`` (as stdout, stderr to stdout), then call
    ``launched()`` so that only the JVM holds the write end: the thread ends when it
    has exited. ``recent`` keeps the last lines, for an error about a JVM that did
    not start.
    """

    def __init__(self, logger_prefix: str = "spark") -> None:
        self._read_fd, self.write_fd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(self.write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._prefix = logger_prefix
        self._assembler = JvmLineAssembler()
        self.recent: deque[str] = deque(maxlen=20)
        self._quiet = threading.Event()
        self._thread = start_thread("jvm-output", self._run)

    def launched(self) -> None:
        if self.write_fd >= 0:  # once: the number may belong to another file later
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def join(self, timeout: float) -> bool:
        """Waits for the JVM's output to end (it has exited); whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def drain(self, timeout: float) -> None:
        """Waits until what the JVM wrote so far is logged (the pipe went quiet)."""
        if self._thread.is_alive():
            self._quiet.clear()
            self._quiet.wait(timeout)

    def _run(self) -> None:
        pending = b""
        try:
            with selectors.DefaultSelector() as selector:  # select() stops at fd 1024
                selector.register(self._read_fd, selectors.EVENT_READ)
                while True:
                    if not selector.select(QUIET_SECONDS):
                        self._log(self._assembler.flush())
                        self._quiet.set()
                        continue
                    chunk = os.read(self._read_fd, 65536)
                    if not chunk:
                        break
                    *lines, pending = (pending + chunk).split(b"\n")
                    if len(pending) > MAX_LINE_BYTES:
                        lines.append(pending)
                        pending = b""
                    for line in lines:
                        self._feed(line)
        finally:
            if pending:
                self._feed(pending)
            self._log(self._assembler.flush())
            with contextlib.suppress(OSError):
                os.close(self._read_fd)
            self._quiet.set()

    def _feed(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace")
        if line.strip():
            self.recent.append(line.rstrip())
        self._log(self._assembler.feed(line))

    def _log(self, records: list[JvmRecord]) -> None:
        for record in records:
            logging.getLogger(f"{self._prefix}.{record.source}").log(record.level, record.text)
