"""The operator's terminal while a bounded run draws its progress bar.

A bar on a terminal breaks as soon as anything else writes to the terminal while
it is drawn: the supervisor's log records, its worker processes (they share its
stderr), native code, a warning. Routing Python's logging through the bar's
console is not enough, since most of those writers are other processes or below
Python. So ``Terminal`` takes the terminal away from all of them at once: it keeps a
duplicate of the terminal's descriptor for itself, puts a pipe on fds 2 (and 1,
when that is the same terminal), and a thread prints what comes out of the pipe,
line by line and unchanged (the kv/JSON lines of ``ingest.logs``), through
``rich``'s console, which draws it above a live bar. Processes started afterwards
(the workers' fork server, Spark's JVM, whose output ``jvmlog`` relays into the log
anyway) inherit the pipe. Only the console writes to the terminal.

Open it before anything starts a process; ``close`` restores the descriptors and
waits for what was written so far to be printed. Children still running keep
writing into the pipe, and the thread goes on printing it (there is no bar left).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import sys
import threading
import time
from types import TracebackType

from rich.console import Console
from rich.text import Text

from ingest.processes import start_thread

__all__ = ["Terminal", "on_terminal"]

_PIPE_BYTES = 1 << 20
_QUIET_SECONDS = 0.05
_active: Terminal | None = None


def on_terminal() -> bool:
    """Whether stderr is a terminal (where a bounded run draws its bar)."""
    return os.isatty(2)


class Terminal:
    """fds 2 (and 1 when it is the same terminal) through a pipe, printed by ``console``."""

    def __init__(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._saved = os.dup(2)
        tty = os.ttyname(2) if os.isatty(2) else None
        self._fds = [2] + ([1] if tty is not None and os.isatty(1) and os.ttyname(1) == tty else [])
        size = os.get_terminal_size(self._saved) if tty is not None else None
        self.console = Console(
            file=os.fdopen(self._saved, "w", encoding="utf-8", errors="replace"),
            width=size.columns if size else None,
            height=size.lines if size else None,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self._restore = {fd: os.dup(fd) for fd in self._fds}
        self._read_fd, write_fd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        for fd in self._fds:
            os.dup2(write_fd, fd)
        os.close(write_fd)
        self._quiet = threading.Event()
        self._thread = start_thread("terminal", self._relay)
        global _active
        _active = self

    def _relay(self) -> None:
        pending = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self._read_fd, selectors.EVENT_READ)
            while True:
                if not selector.select(_QUIET_SECONDS):
                    self._quiet.set()
                    continue
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                if lines:
                    self._print(b"\n".join(lines))
        if pending:
            self._print(pending)
        os.close(self._read_fd)
        self._quiet.set()

    def _print(self, raw: bytes) -> None:
        text = Text(raw.decode("utf-8", "replace").replace("\r", ""))
        with contextlib.suppress(OSError, ValueError):
            self.console.print(text, soft_wrap=True)

    def restore(self) -> None:
        """The descriptors back on the terminal (idempotent; a second signal calls it
        before it writes and exits)."""
        global _active
        for fd, saved in self._restore.items():
            with contextlib.suppress(OSError):
                os.dup2(saved, fd)
                os.close(saved)
        self._restore = {}
        if _active is self:
            _active = None

    def drain(self, timeout: float = 2.0) -> None:
        """Waits until what was written so far is printed (the pipe went quiet, or it
        ended: no child holds it any more): before the bar is drawn for the last time,
        so the run's last records land above it, not below."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        self._quiet.clear()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            if self._quiet.wait(_QUIET_SECONDS):
                break

    def close(self, timeout: float = 2.0) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        self.restore()
        # What was written before the restore is in the pipe: printed before we return.
        self.drain(timeout)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    @staticmethod
    def active() -> Terminal | None:
        return _active
