"""A self-pipe that wakes the supervisor's loop when a thread has news for it.

The loop waits on its workers' pipes for at most ``_LOOP_WAIT``; the membership thread
(an assignment, a commit's outcome) and a batch's thread (the batch is done) have no
pipe of their own, so without this the loop noticed them up to one wait later (measured
on a 100k-record ``--until-end`` run: 9 such waits, ~0.45 s spent asleep). ``set`` is
safe from any thread and never blocks; the loop passes the wakeup to
``multiprocessing.connection.wait`` beside the workers' pipes, then ``clear``s it.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["Wakeup"]


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # set() and close() under it: a set() after close() must not write to a reused fd.
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        with self._lock:
            if self._closed:
                return
            # A full pipe: a wakeup is pending already.
            with contextlib.suppress(BlockingIOError):
                os.write(self._write, b"\0")

    def clear(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass  # drained

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read)
            os.close(self._write)
