"""A partition worker's main loop: fetch, append to segments, seal, obey controls, backpressure.

``PartitionWorker`` runs in the worker process (``process.py``) but is a plain
class over a fetcher, a segment writer, an ``emit`` callback and a
``ControlInbox``, so it can also run in a test's own process.

Backpressure: the bytes of segments the parent has not released, plus the open
segment, are the worker's unacknowledged bytes. At ``max_unacked_bytes`` the
worker seals its open segment (so the parent can release it) and stops
fetching; releases bringing the total down to ``resume_unacked_bytes`` let it
fetch again. It never prefetches a Fetch that would start above the cap, so
the cap is exceeded by at most one Fetch answer.

A full handoff (``HandoffFull``: ENOSPC) is backpressure too. What the writer
published before the failed write is reported; the records that did not fit are
*held* in memory, in order with any corrupt ranges after them, and nothing is
fetched until they are written. The worker tells the parent (``BackpressureChanged``
with reason ``handoff_full``), which lands and releases what it holds; the worker
retries every ``_FULL_RETRY`` seconds and on every release. If the handoff stays full
for ``handoff.full_timeout``, the worker fails with ``HandoffSpaceExhausted``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal, TypeAlias

import pyarrow as pa

from ingest.handoff.messages import CorruptRangeReported, SegmentSealed
from ingest.handoff.segment import SegmentWriter
from ingest.handoff.space import free_bytes
from ingest.handoff.store import HandoffFull, HandoffSpaceExhausted
from ingest.protocol.recordbatch.records import OFFSET_COLUMN, int64_values
from ingest.worker.epochs import EpochTrack
from ingest.worker.fetcher import PartitionFetcher
from ingest.worker.parent_messages import (
    BackpressureChanged,
    Control,
    Event,
    Limits,
    OffsetResetApplied,
    Pause,
    Release,
    Resume,
    StopAfterSeal,
    StopNow,
    WorkerFinished,
    WorkerStarted,
)
from ingest.worker.results import CorruptRange, FetchResult, UnreadableCorruption

__all__ = ["ControlInbox", "PartitionWorker"]

log = logging.getLogger("ingest.worker")

# Longest sleep while paused with no segment open; controls wake it earlier.
_IDLE_WAIT = 1.0
# How often a worker holding records tries a full handoff again (a release wakes it).
_FULL_RETRY = 0.5

# What a full handoff could not take yet: records, then the corrupt ranges after them.
_Held: TypeAlias = "pa.RecordBatch | CorruptRange"


class ControlInbox:
    """Controls handed from the control thread (or a test) to the loop. Thread-safe."""

    def __init__(self) -> None:
        self._queue: deque[Control] = deque()
        self._wake = threading.Event()
        self.stop_now = threading.Event()
        # The parent's latest word, seen before the loop takes it: a Fetch answer that
        # arrives meanwhile is not followed by another (the global cap's overshoot).
        self.pause_requested = False

    def put(self, control: Control) -> None:
        if isinstance(control, StopNow):
            self.stop_now.set()
        elif isinstance(control, Pause | Resume):
            self.pause_requested = isinstance(control, Pause)
        self._queue.append(control)
        self._wake.set()

    def take(self) -> list[Control]:
        taken: list[Control] = []
        while True:
            try:
                taken.append(self._queue.popleft())
            except IndexError:
                return taken

    def wait(self, timeout: float) -> None:
        """Sleeps until a control arrives or ``timeout`` passes."""
        if self._wake.wait(timeout):
            self._wake.clear()


class PartitionWorker:
    """Drives one partition's fetcher into its segment writer. Single-owner."""

    def __init__(
        self,
        fetcher: PartitionFetcher,
        writer: SegmentWriter,
        emit: Callable[[Event], None],
        inbox: ControlInbox,
        *,
        max_unacked_bytes: int,
        resume_unacked_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetcher = fetcher
        self.writer = writer
        self.emit = emit
        self.inbox = inbox
        self.max_unacked_bytes = max_unacked_bytes
        self.resume_unacked_bytes = resume_unacked_bytes
        self._clock = clock
        self._unacked: dict[str, int] = {}
        self._unacked_sealed = 0
        self.paused_by_parent = False
        self.backpressure = False
        self._stop_after_seal = False
        self._held: deque[_Held] = deque()
        self._full_since: float | None = None
        self.records = 0
        self.segments = 0
        self.epochs = EpochTrack()  # leader epochs of the offsets fetched

    @property
    def topic(self) -> str:
        return self.fetcher.topic

    @property
    def partition(self) -> int:
        return self.fetcher.partition

    @property
    def unacked_bytes(self) -> int:
        return self._unacked_sealed + self.writer.open_bytes

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> WorkerFinished:
        start = self.fetcher.start()
        self.writer.skip_to(start)
        how: str = self.fetcher.start_position.kind
        if self.fetcher.start_position.value is not None:
            how += f" {self.fetcher.start_position.value}"
        self.emit(
            WorkerStarted(
                topic=self.topic,
                partition=self.partition,
                pid=os.getpid(),
                start_offset=start,
                end_offset=self.fetcher.end_offset,
                how=how,
            )
        )
        try:
            return self._loop()
        except UnreadableCorruption as exc:
            # Everything before the broken batch is good: publish it, then the report.
            self._seal()
            self._write_corrupt(exc.corrupt)
            raise
        finally:
            self.fetcher.close()

    def _loop(self) -> WorkerFinished:
        while True:
            self._apply_controls()
            if self.inbox.stop_now.is_set():
                self.writer.abort()
                return self._finished("stop_now", self.writer.covered_until)
            if self._stop_after_seal:
                self._seal()
                return self._finished("stopped", self._next_unwritten())
            if self._held:
                if not self._write_held():
                    self.inbox.wait(_FULL_RETRY)
                continue
            if self.writer.due():
                self._seal()
            if self.fetcher.finished:
                self._seal()
                return self._finished("end", self._position())
            self._update_backpressure()
            if (self.paused_by_parent or self.backpressure) and not self.fetcher.in_flight:
                if self.backpressure and self.writer.is_open:
                    self._seal()
                    continue
                until_due = self.writer.seconds_until_due()
                self.inbox.wait(_IDLE_WAIT if until_due is None else min(until_due, _IDLE_WAIT))
                continue
            self._take(self.fetcher.poll(prefetch=self._may_prefetch))

    def _may_prefetch(self, result: FetchResult) -> bool:
        if self.paused_by_parent or self.inbox.pause_requested:
            return False
        if self._stop_after_seal or self.inbox.stop_now.is_set():
            return False
        incoming = result.batch.nbytes if result.batch is not None else 0
        return self.unacked_bytes + incoming < self.max_unacked_bytes

    def _take(self, result: FetchResult) -> None:
        self.epochs.note(result.epochs)
        for reset in result.resets:
            self._seal(next_offset=reset.old_offset)
            self.writer.skip_to(reset.new_offset)
            self.emit(
                OffsetResetApplied(
                    topic=self.topic,
                    partition=self.partition,
                    old_offset=reset.old_offset,
                    new_offset=reset.new_offset,
                    policy=reset.policy,
                    reason=reset.reason,
                )
            )
        work: list[_Held] = [] if result.batch is None else [result.batch]
        work += result.corrupt
        self._write(work)
        if not self._held and self.writer.due():
            self._seal()

    def _position(self) -> int:
        position = self.fetcher.position
        assert position is not None
        return position

    def _next_unwritten(self) -> int:
        """The first offset not in a segment: the fetch position, or the first held one
        (a segment sealed while records are held ends there, not at the position)."""
        if not self._held:
            return self._position()
        first = self._held[0]
        return first.first_offset if isinstance(first, CorruptRange) else _first_offset(first)

    # -- writing, and a full handoff ------------------------------------------------------

    def _write(self, work: list[_Held]) -> None:
        """Writes records and corrupt ranges in order; what a full handoff refuses is held."""
        for index, item in enumerate(work):
            try:
                if isinstance(item, CorruptRange):
                    self._write_corrupt(item)
                else:
                    self._append(item)
            except _Refused as refused:
                self._hold([refused.rest, *work[index + 1 :]], refused.cause)
                return
            except HandoffFull as exc:  # a corrupt range's side file
                self._hold(work[index:], exc)
                return

    def _write_corrupt(self, bad: CorruptRange) -> None:
        """Publishes a corrupt range's raw bytes as a side file and reports it."""
        self._track(
            self.writer.write_corrupt(
                first_offset=bad.first_offset,
                last_offset=bad.last_offset,
                raw=bad.raw,
                reason=bad.reason,
                kind=bad.kind,
            )
        )

    def _append(self, batch: pa.RecordBatch) -> None:
        """Appends, sealing at the size bound inside the batch: a compressed Fetch answer
        can decode to many times the bound. Raises ``_Refused`` with the records not
        written when the handoff is full."""
        while batch.num_rows:
            size = batch.nbytes
            room = self.writer.room()
            spare = self._spare_room()
            if size <= min(room, spare):
                head, rest = batch, batch.slice(batch.num_rows)
            else:
                rows = batch.num_rows * min(room, spare) // size
                if rows == 0:
                    if self.writer.is_open:
                        self._seal(next_offset=_first_offset(batch))
                        continue
                    if spare < room:  # the filesystem, not the bound: wait for room
                        raise _Refused(batch, HandoffFull(f"{spare} bytes to spare"))
                    rows = 1  # one record above the bound: a segment of its own
                head, rest = batch.slice(0, rows), batch.slice(rows)
            try:
                self.writer.append(head)
            except HandoffFull as exc:
                salvaged = self.writer.take_salvaged()
                if salvaged is not None:
                    self.segments += 1
                    self._track(salvaged)
                raise _Refused(batch, exc) from exc
            self.records += head.num_rows
            batch = rest
            if batch.num_rows:
                self._seal(next_offset=_first_offset(batch))

    def _spare_room(self) -> int:
        """While a full handoff holds records back: half the free space (other workers
        share it), so a write that fits is not refused for want of a whole segment. Else
        no limit."""
        if self._full_since is None:
            return 2**62
        free = free_bytes(self.writer.directory)
        return 2**62 if free is None else free // 2

    def _hold(self, work: list[_Held], cause: HandoffFull) -> None:
        self._held.extend(work)
        if self._full_since is None:
            self._full_since = self._clock()
            free = free_bytes(self.writer.directory)
            log.warning(
                "%s/%d: handoff full (%s, %s bytes free): holding from offset %d, "
                "fetching paused until it has room",
                self.topic,
                self.partition,
                cause,
                "?" if free is None else free,
                self.writer.covered_until,
            )
            self.emit(BackpressureChanged(self.partition, True, self.unacked_bytes, "handoff_full"))

    def _write_held(self) -> bool:
        """Tries the held work again; True once all of it is written."""
        work = list(self._held)
        self._held.clear()
        self._write(work)
        if self._held:
            assert self._full_since is not None
            waited = self._clock() - self._full_since
            timeout = self.writer.config.full_timeout
            if waited >= timeout:
                free = free_bytes(self.writer.directory)
                raise HandoffSpaceExhausted(
                    f"{self.topic}/{self.partition}: the handoff at "
                    f"{self.writer.location.config.resolved_root} stayed full for "
                    f"{waited:.0f}s (handoff.full_timeout = {timeout:g}s; "
                    f"{'?' if free is None else free} bytes free, {self.unacked_bytes} held "
                    "by this worker): another writer holds the space. Free it, or give the "
                    "handoff a filesystem of its own"
                )
            return False
        assert self._full_since is not None
        log.info(
            "%s/%d: handoff has room again after %.1fs: fetching again",
            self.topic,
            self.partition,
            self._clock() - self._full_since,
        )
        self._full_since = None
        self.emit(BackpressureChanged(self.partition, False, self.unacked_bytes, "handoff_full"))
        return True

    def _seal(self, next_offset: int | None = None) -> None:
        sealed = self.writer.seal(self._next_unwritten() if next_offset is None else next_offset)
        if sealed is not None:
            self.segments += 1
            self._track(sealed)

    def _track(self, item: SegmentSealed | CorruptRangeReported) -> None:
        if isinstance(item, SegmentSealed):
            item = dataclasses.replace(item, leader_epoch=self.epochs.at(item.next_offset - 1))
            self.epochs.trim(item.next_offset - 1)
        item_id = item.segment_id if isinstance(item, SegmentSealed) else item.corrupt_id
        self._unacked[item_id] = item.bytes
        self._unacked_sealed += item.bytes
        self.emit(item)

    def _finished(
        self, reason: Literal["end", "stopped", "stop_now"], next_offset: int
    ) -> WorkerFinished:
        message = WorkerFinished(
            topic=self.topic,
            partition=self.partition,
            reason=reason,
            next_offset=next_offset,
            segments=self.segments,
            records=self.records,
        )
        log.info(
            "%s/%d: finished (%s) at offset %d: %d records in %d segments",
            self.topic,
            self.partition,
            reason,
            message.next_offset,
            self.records,
            self.segments,
        )
        self.emit(message)
        return message

    # -- controls and backpressure ------------------------------------------------------

    def _apply_controls(self) -> None:
        for control in self.inbox.take():
            if isinstance(control, Pause):
                self.paused_by_parent = True
            elif isinstance(control, Resume):
                self.paused_by_parent = False
            elif isinstance(control, StopAfterSeal):
                self._stop_after_seal = True
            elif isinstance(control, Release):
                for item_id in control.item_ids:
                    self._unacked_sealed -= self._unacked.pop(item_id, 0)
            elif isinstance(control, Limits):
                self.writer.segment_max_bytes = control.segment_max_bytes
                self.max_unacked_bytes = control.max_unacked_bytes
                self.resume_unacked_bytes = control.resume_unacked_bytes
            elif isinstance(control, StopNow):
                pass  # inbox.stop_now is already set

    def _update_backpressure(self) -> None:
        used = self.unacked_bytes
        if not self.backpressure and used >= self.max_unacked_bytes:
            self.backpressure = True
            log.info(
                "%s/%d: %d unreleased bytes reach the cap of %d: fetching paused",
                self.topic,
                self.partition,
                used,
                self.max_unacked_bytes,
            )
            self.emit(BackpressureChanged(self.partition, True, used))
        elif self.backpressure and used <= self.resume_unacked_bytes:
            self.backpressure = False
            log.info("%s/%d: %d unreleased bytes: fetching again", self.topic, self.partition, used)
            self.emit(BackpressureChanged(self.partition, False, used))


class _Refused(Exception):
    """Control flow of ``_append``: the handoff is full; ``rest`` was not written."""

    def __init__(self, rest: pa.RecordBatch, cause: HandoffFull) -> None:
        super().__init__(str(cause))
        self.rest = rest
        self.cause = cause


def _first_offset(batch: pa.RecordBatch) -> int:
    return int(int64_values(batch.column(OFFSET_COLUMN))[0])
