"""Child-process plumbing shared by the servers (Tansu, SeaweedFS) and the test harness.

Servers run in their own session (so a kill reaches their children too), die
with the Python process that started them (PR_SET_PDEATHSIG), and log to a
file that outlives them, so a failing test can show what the server said.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from ingest.errors import HarnessError

_PR_SET_PDEATHSIG = 1

# Every server the harness started in this process, so a session can check
# that none is left behind.
_LIVE: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()
STARTED_PIDS: list[int] = []


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the test process is killed,
    # the kernel kills the server too, so no orphan outlives a crashed run.
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(*, also_free_at_offset: int | None = None) -> int:
    """A TCP port on 127.0.0.1 that is free now (and port+offset too, if asked)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if also_free_at_offset is None:
            return port
        other = port + also_free_at_offset
        if other < 65536 and port_is_free(other):
            return port
    raise HarnessError("could not find a free loopback port")


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22), or
    None when no such process runs: with the pid, it names one process, since a pid is
    reused once its process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name may hold spaces and parentheses: the fields after it.
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class ManagedProcess:
    """One server process with a persistent log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self._started: int | None = None  # start_time of the process group's leader

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def start(self) -> None:
        if self.running():
            raise HarnessError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise HarnessError(f"cannot start {self.name}: {exc}") from exc
        self._started = start_time(self.popen.pid)
        STARTED_PIDS.append(self.popen.pid)
        _LIVE.add(self)

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def send_signal(self, sig: int) -> None:
        if self.popen is None:
            raise HarnessError(f"{self.name} was never started")
        self._signal_group(sig)

    def _signal_group(self, sig: int) -> None:
        """Signals the process group, unless its id is another process's now: the group
        ended, and a process started since (a group leader) took the pid."""
        assert self.popen is not None
        now = start_time(self.popen.pid)
        if now is not None and self._started is not None and now != self._started:
            return  # (no start time read at launch: signalled as before)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop(self, *, timeout: float = 5.0, sig: int = signal.SIGTERM) -> int | None:
        """Stops the process group by PID; escalates to SIGKILL after ``timeout``."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.send_signal(signal.SIGCONT)  # a SIGSTOPped server cannot act on SIGTERM
            self.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                self.popen.wait(10)
        # The group may hold children that outlived the leader (while it does, the kernel
        # gives its id to no new process).
        self._signal_group(signal.SIGKILL)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.popen is not None and self.popen.poll() is None:
            self.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - max_bytes))
                return log.read().decode("utf-8", "replace")
        except OSError:
            return f"(no log at {self.log_path})"

    def died_message(self) -> str:
        code = self.popen.returncode if self.popen is not None else None
        return f"{self.name} exited with code {code}; log {self.log_path}:\n{self.log_tail(4000)}"


class ProcessServer:
    """What every one-process server of the harness shares: it runs as ``process``, is
    stopped by PID (SIGTERM, then SIGKILL after ``stop_timeout``), shows its log, and,
    when it made its own ``work_dir``, removes it in ``cleanup``. A subclass sets those
    and writes ``start`` (which must return ``self`` once the server is ready)."""

    process: ManagedProcess
    stop_timeout: float = 5.0
    work_dir: Path | None = None
    owns_work_dir: bool = False

    def start(self) -> Self:
        raise NotImplementedError

    def _start_until(
        self, ready: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1
    ) -> None:
        """Starts ``process`` and returns once ``ready()``: HarnessError at once if the
        process exits first, or with its log's tail (the process stopped) when ``timeout``
        passes; ``what`` says what it waited for ("answer ApiVersions"). A ``ready`` that
        raises counts as not ready (the last error is in the timeout's message)."""
        self.process.start()
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            if not self.process.running():
                raise HarnessError(self.process.died_message())
            try:
                if ready():
                    return
            except Exception as exc:
                last_error = exc
            if time.monotonic() > deadline:
                tail = self.process.log_tail(4000)
                self.process.stop(timeout=5)
                detail = f" (last error: {last_error})" if last_error else ""
                raise HarnessError(
                    f"{self.process.name} did not {what} within {timeout:.0f}s{detail}; its "
                    f"log {self.log_path}:\n{tail}"
                )
            time.sleep(interval)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def running(self) -> bool:
        return self.process.running()

    def stop(self) -> int | None:
        """Stops the server by PID (SIGTERM, then SIGKILL). Keeps its log."""
        return self.process.stop(timeout=self.stop_timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.process.kill()

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its connections open."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        return self.process.log_tail(max_bytes)

    def cleanup(self) -> None:
        """Stops the server and removes its work directory (log included) if it made it."""
        self.stop()
        if self.owns_work_dir and self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def live_processes() -> list[ManagedProcess]:
    return [proc for proc in list(_LIVE) if proc.running()]


def stop_all() -> None:
    for proc in live_processes():
        proc.stop(timeout=3)


def wait_until(predicate, *, timeout: float, interval: float = 0.02, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as exc:
            last_error = exc
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    raise HarnessError(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
