"""Where ingest's threads and child processes start: ``start_thread`` starts and names every
thread (``ingest-<name>``, a daemon: each one's owner stops and joins it); facts about
other processes, shared by the supervisor and the test harness; and the fork server the
partition workers and the local engine's task processes fork from.

The fork server is a fresh interpreter that imports the workers' modules once
(``ingest.worker.process``, and the local engine's task modules named with
``preload_in_fork_server`` before it starts); every fork inherits them. It lives here,
with nothing imported, so ``ingest run`` can start it on the other core right after the
config loads, while the supervisor still imports its own modules and joins the group.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import threading
from collections.abc import Callable
from multiprocessing.context import ForkServerContext
from typing import Any

__all__ = [
    "TASK_MODULES",
    "THREAD_PREFIX",
    "fork_context",
    "ingest_threads",
    "pid_alive",
    "preload_in_fork_server",
    "start_fork_server",
    "start_thread",
]

# Every thread ingest starts is named so: ``ingest_threads`` finds them.
THREAD_PREFIX = "ingest-"


def start_thread(name: str, target: Callable[..., Any], *args: Any) -> threading.Thread:
    """Starts ``target(*args)`` on a daemon thread named ``ingest-<name>``; the caller owns
    it: it stops the thread (the target's own end condition) and joins it."""
    thread = threading.Thread(target=target, args=args, name=f"{THREAD_PREFIX}{name}", daemon=True)
    thread.start()
    return thread


def ingest_threads() -> list[threading.Thread]:
    """The live threads ingest started (``start_thread``)."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


# What the fork server imports: the worker's module, then the local engine's task modules.
_PRELOAD: list[str] = ["ingest.worker.process"]
# The local engine's task modules (ingest/engines/local/task_pool.py); by name, nothing is imported here.
TASK_MODULES = ("ingest.engines.local.task_process",)


def preload_in_fork_server(*modules: str) -> None:
    """Has the fork server import ``modules`` too, if it has not started yet: the
    processes forked from it for other jobs (the local engine's tasks) start with them."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


def fork_context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_PRELOAD))
    return context


def start_fork_server(*, tasks: bool = False) -> None:
    """Starts the fork server now, once (it imports in the background), with SIGINT
    ignored so that its forks ignore it from their first instruction: Ctrl-C reaches the
    whole process group, and stopping workers is the supervisor's business. ``tasks``:
    it imports the local engine's task modules too. The open-files limit is raised
    first: the server keeps the limit it starts with, and each worker forked from it
    holds one of its descriptors while it starts."""
    raise_open_files_limit()
    if tasks:
        preload_in_fork_server(*TASK_MODULES)
    fork_context()
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    # Blocked while the disposition is SIG_IGN, so a Ctrl-C in this window is not lost:
    # it is delivered to our own handler once unblocked.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


# File descriptors the supervisor holds besides its workers', and per worker (its pipes,
# its process handle, the fork server's connection), measured with 400 workers
# (scripts/bench/many_topics.py: 32 + 4 per worker).
BASE_FDS = 32
FDS_PER_WORKER = 4


def raise_open_files_limit() -> int:
    """Raises this process's soft limit on open files to the hard one (as Kafka's and
    Spark's start scripts do: one worker per partition takes four descriptors here) and
    returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # the soft limit stays; a spawn that meets it says so (pool.py)
    return soft


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
