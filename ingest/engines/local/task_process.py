"""What runs inside a local-engine task process (``task_pool.py`` runs the pool): the process's
start (its name, and its exit when the supervisor is gone) and one files task.

Kept apart from ``task_pool.py`` so a task process imports only the task's modules
(``plan.py``: pyarrow, the decoder, the Parquet writer), not the driver's (the landing
protocol, delta-rs's MERGE, pyarrow.dataset and pandas behind it).
"""

from __future__ import annotations

import contextlib
import os
import time
from multiprocessing.synchronize import Barrier
from threading import BrokenBarrierError

from ingest.engines.plan import decode_plan, files_task
from ingest.processes import pid_alive, start_thread

__all__ = ["PARENT_CHECK_S", "TASK_PROCESS_NAME", "ready", "run_task", "task_process_start"]

# Task processes fork from the fork server and keep its command line; the name tells
# them apart from partition workers in ps -o comm, top and the fault tests.
TASK_PROCESS_NAME = "ingest-task"
# How often a task process looks whether the supervisor is still alive.
PARENT_CHECK_S = 0.5


def run_task(encoded: str, index: int) -> list[tuple[str, str]]:
    return files_task(decode_plan(encoded), index)


_warm_barrier: Barrier | None = None


def ready(timeout: float) -> int:
    """A warm-up task: waits (at most ``timeout`` seconds) until each of the pool's
    processes runs one, so no process is idle while the warm-up tasks are submitted and
    the pool starts a process for each (it starts one only when none is idle)."""
    if _warm_barrier is not None:
        with contextlib.suppress(BrokenBarrierError):
            _warm_barrier.wait(timeout)
    return os.getpid()


def task_process_start(supervisor: int, warm_barrier: Barrier | None = None) -> None:
    global _warm_barrier
    _warm_barrier = warm_barrier
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(TASK_PROCESS_NAME)
    # A pool process holds both ends of its call queue, so the supervisor's death is no
    # end of file to it: without this it would wait for work forever.
    start_thread("task-parent-watch", _exit_with, supervisor)


def _exit_with(supervisor: int) -> None:
    while pid_alive(supervisor):
        time.sleep(PARENT_CHECK_S)
    os._exit(3)
