"""Fault injection: real SIGKILLs of real processes, at chosen or seeded moments.

Two ways in:

* ``fault_point(name)``: the supervisor calls it at the few moments no outside
  observer can hit reliably (``after_delta_commit``: the batch is durable in Delta,
  its offsets are not committed yet; ``after_offset_commit``: committed, segments
  not yet released). With ``INGEST_FAULT_POINT=<name>:<n>`` in the environment the
  process SIGKILLs itself on the n-th time it passes ``name``; without the variable
  the call is one comparison. Nothing is simulated: the kernel kills the process,
  its workers see their parent vanish and Spark's JVM sees its stdin close.
* ``process_tree`` / ``kill``: find a run's processes through /proc (the supervisor,
  its partition workers, the Spark JVM) and SIGKILL some of them from outside.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "FAULT_POINTS",
    "FAULT_POINT_ENV",
    "ProcessInfo",
    "fault_point",
    "fault_point_env",
    "kill",
    "process_tree",
]

from ingest.faults import FAULT_POINT_ENV, FAULT_POINTS, fault_point, fault_point_env

# ingest.worker.process.WORKER_PROCESS_NAME (this package does not import the worker).
WORKER_PROCESS_NAME = "ingest-worker"
# ingest.engines.local.task_pool.TASK_PROCESS_NAME: a local-engine task process.
TASK_PROCESS_NAME = "ingest-task"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    cmdline: str
    name: str = ""  # /proc/<pid>/comm

    @property
    def kind(self) -> str:
        """``jvm``, ``worker`` (a partition worker), ``task`` (a local-engine task process),
        ``python`` or ``other``."""
        if "java" in self.cmdline.split(" ", 1)[0] or "org.apache.spark" in self.cmdline:
            return "jvm"
        if self.name == TASK_PROCESS_NAME:
            return "task"
        # Workers fork from a fork server and keep its command line; they rename themselves.
        if self.name == WORKER_PROCESS_NAME or "spawn_main" in self.cmdline:
            return "worker"
        if "python" in self.cmdline.split(" ", 1)[0]:
            return "python"
        return "other"


def _read(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as cmd:
            cmdline = cmd.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/comm") as comm:
            name = comm.read().strip()
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    return ProcessInfo(pid, int(fields[1]), cmdline, name)


def process_tree(root: int) -> list[ProcessInfo]:
    """``root`` and its live descendants (zombies left out), parents first."""
    table: dict[int, ProcessInfo] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read(int(entry))
            if info is not None:
                table[info.pid] = info
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    out: list[ProcessInfo] = []
    queue = [table[root]] if root in table else []
    while queue:
        info = queue.pop(0)
        out.append(info)
        queue.extend(sorted(children.get(info.pid, []), key=lambda i: i.pid))
    return out


def kill(processes: Iterable[ProcessInfo | int]) -> list[int]:
    """SIGKILLs each process (already gone ones are skipped); returns the pids killed."""
    killed = []
    for process in processes:
        pid = process if isinstance(process, int) else process.pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(pid)
    return killed
