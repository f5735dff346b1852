"""How an engine lands a batch: it drives the sink's ``landing`` generator, writing with
its own tasks each ``WriteRequest`` the landing yields and sending back what was written.
The sink never calls up into an engine."""

from __future__ import annotations

from collections.abc import Callable

from ingest.sink.batch import Batch, BatchResult, WriteRequest, WrittenFiles
from ingest.sink.land import landing

__all__ = ["Write", "drive_landing"]

# An engine's tasks for one request: planned and run, returning the files written.
Write = Callable[[WriteRequest], WrittenFiles]


def drive_landing(batch: Batch, write: Write) -> BatchResult:
    """Lands ``batch``: the landing's requests written by ``write``. A write that fails is
    thrown into the landing, which deletes what the attempt had handed it and raises it."""
    steps = landing(batch)
    request = next(steps)
    while True:
        try:
            written = write(request)
        except BaseException as exc:
            steps.throw(exc)  # raises: the landing never resumes after a failed write
            raise
        try:
            request = steps.send(written)
        except StopIteration as done:
            result: BatchResult = done.value
            return result
