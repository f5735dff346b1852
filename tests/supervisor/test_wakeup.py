"""The loop's self-pipe: a thread's set() ends the loop's wait; clear() re-arms it."""

from __future__ import annotations

import multiprocessing.connection
import threading

from ingest.supervisor.engine.wakeup import Wakeup


def test_a_set_from_another_thread_ends_the_wait_and_clear_rearms_it() -> None:
    wakeup = Wakeup()
    try:
        assert multiprocessing.connection.wait([wakeup], 0) == []
        threading.Thread(target=wakeup.set).start()
        assert multiprocessing.connection.wait([wakeup], 30) == [wakeup]
        for _ in range(100_000):  # more than a pipe holds: set() never blocks
            wakeup.set()
        wakeup.clear()
        assert multiprocessing.connection.wait([wakeup], 0) == []
    finally:
        wakeup.close()


def test_a_set_after_close_writes_nowhere() -> None:
    wakeup = Wakeup()
    wakeup.close()
    wakeup.set()  # a late batch thread: no error, and no write to a reused descriptor
    wakeup.close()
