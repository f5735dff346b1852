"""The worker's side of the handoff: append decoded record batches, seal segments.

One ``SegmentWriter`` per partition. A segment is one Arrow IPC stream of
``RECORD_SCHEMA`` batches, opened on the first record appended after the last
seal and sealed when it passes the size or age bound of ``HandoffConfig`` (the
caller asks ``due()``), when the worker stops, or before an offset reset. The
writer tracks the span of offsets it has accounted for, so every
``SegmentSealed`` says which offsets it covers (see ``messages.py``).

A full filesystem (ENOSPC) is not a broken segment. On a local filesystem the
failed write is cut off (the file is truncated to where the batch began) and the
records before it are published as a segment without the stream's end marker,
which readers treat as the end; the writer then raises ``HandoffFull`` and holds
the published segment in ``salvaged`` for the caller to report. The batch that did
not fit is the caller's to append again once there is room.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable

import pyarrow as pa
import pyarrow.ipc as ipc

from ingest.handoff.location import (
    CORRUPT_PREFIX,
    HandoffLocation,
    create_private_file,
    make_private_dir,
)
from ingest.handoff.messages import CorruptRangeReported, SegmentSealed
from ingest.handoff.store import TMP_SUFFIX, HandoffError, HandoffFull, file_checksum, is_full
from ingest.protocol.partition import topic_name_problem
from ingest.protocol.recordbatch.records import OFFSET_COLUMN, TIMESTAMP_COLUMN, int64_values

__all__ = ["SegmentWriter"]

log = logging.getLogger("ingest.handoff")


class _OpenSegment:
    def __init__(
        self,
        segment_id: str,
        final_path: str,
        write_path: str,
        sink: pa.NativeFile,
        writer: ipc.RecordBatchStreamWriter,
        opened_at: float,
        from_offset: int,
    ) -> None:
        self.segment_id = segment_id
        self.final_path = final_path
        self.write_path = write_path
        self.sink = sink
        self.writer = writer
        self.opened_at = opened_at
        self.from_offset = from_offset
        self.first_offset = -1
        self.last_offset = -1
        self.records = 0
        self.min_timestamp = 2**63 - 1
        self.max_timestamp = -(2**63)


class SegmentWriter:
    """Writes one partition's segments into a run namespace. Single-owner."""

    def __init__(
        self,
        location: HandoffLocation,
        topic: str,
        partition: int,
        *,
        start_offset: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.location = location
        self.config = location.config
        self.topic = topic
        self.partition = partition
        self._clock = clock
        self._fs = location.filesystem()
        problem = topic_name_problem(topic)
        if problem is not None:  # a name from the cluster, never a path of ours to follow
            raise HandoffError(f"a topic cannot name a handoff directory: {problem}")
        self._directory = f"{location.namespace}/{topic}/{partition}"
        if self._fs is None:  # the namespace is this user's, 0700 (``HandoffStore.open``)
            make_private_dir(f"{location.namespace}/{topic}")
            make_private_dir(self._directory)
        else:
            self._fs.create_dir(self._directory, recursive=True)
        self._options = ipc.IpcWriteOptions(compression=self.config.ipc_compression)
        self._open: _OpenSegment | None = None
        # The size bound, which a space plan may lower while the writer lives.
        self.segment_max_bytes = self.config.segment_max_bytes
        # What a full filesystem left publishable (see the module docstring).
        self.salvaged: SegmentSealed | None = None
        # The first offset not yet accounted for by a sealed segment.
        self.covered_until = start_offset
        self.sealed = 0

    def __repr__(self) -> str:
        state = f"open {self._open.segment_id}" if self._open else "idle"
        return f"SegmentWriter({self.topic}/{self.partition}, {state})"

    # -- state --------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        """Where this partition's segments go."""
        return self._directory

    @property
    def is_open(self) -> bool:
        return self._open is not None

    @property
    def open_bytes(self) -> int:
        """Bytes written to the open segment so far (0 when none is open)."""
        return self._open.sink.tell() if self._open is not None else 0

    @property
    def temporary_path(self) -> str | None:
        """Where the open segment is being written (a hidden name on local filesystems)."""
        return self._open.write_path if self._open is not None else None

    def due(self, now: float | None = None) -> bool:
        """Whether the open segment has reached its size or age bound."""
        segment = self._open
        if segment is None:
            return False
        if segment.sink.tell() >= self.segment_max_bytes:
            return True
        now = self._clock() if now is None else now
        return now - segment.opened_at >= self.config.segment_max_age

    def room(self) -> int:
        """Bytes the open (or next) segment may still take before its size bound."""
        return max(0, self.segment_max_bytes - self.open_bytes)

    def seconds_until_due(self, now: float | None = None) -> float | None:
        """Seconds until the age bound seals the open segment; None when none is open."""
        if self._open is None:
            return None
        now = self._clock() if now is None else now
        return max(0.0, self._open.opened_at + self.config.segment_max_age - now)

    # -- writing ------------------------------------------------------------------------

    def append(self, batch: pa.RecordBatch) -> None:
        """Appends decoded records (offsets ascending, above everything appended before)."""
        rows = batch.num_rows
        if rows == 0:
            return
        segment = self._open or self._start(batch)
        offsets = int64_values(batch.column(OFFSET_COLUMN))
        timestamps = int64_values(batch.column(TIMESTAMP_COLUMN))
        first = int(offsets[0])
        if first <= segment.last_offset or first < segment.from_offset:
            raise HandoffError(
                f"{self.topic}/{self.partition}: offset {first} appended after "
                f"{max(segment.last_offset, segment.from_offset - 1)}"
            )
        written = segment.sink.tell()
        try:
            segment.writer.write_batch(batch)
        except OSError as exc:
            if self._fs is None and is_full(exc):
                self._open = None
                self.salvaged = self._salvage(segment, written, first)
                raise HandoffFull(f"writing segment {segment.segment_id}: {exc}") from exc
            raise HandoffError(f"writing segment {segment.segment_id}: {exc}") from exc
        if segment.records == 0:
            segment.first_offset = first
        segment.last_offset = int(offsets[-1])
        segment.records += rows
        segment.min_timestamp = min(segment.min_timestamp, int(timestamps.min()))
        segment.max_timestamp = max(segment.max_timestamp, int(timestamps.max()))

    def _start(self, batch: pa.RecordBatch) -> _OpenSegment:
        first = int(int64_values(batch.column(OFFSET_COLUMN))[0])
        name = f"{first:020d}-{uuid.uuid4().hex[:8]}"
        segment_id = f"{self.topic}/{self.partition}/{name}"
        final_path = self.location.path_of(segment_id)
        try:
            if self._fs is None:
                write_path = f"{self._directory}/.{name}{TMP_SUFFIX}"
                os.close(create_private_file(write_path))  # 0600, new, not through a link
                sink: pa.NativeFile = pa.OSFile(write_path, "wb")
            else:
                # An object-store upload is invisible until complete: no rename needed.
                write_path = final_path
                sink = self._fs.open_output_stream(final_path)
            try:
                writer = ipc.new_stream(sink, batch.schema, options=self._options)
            except OSError:
                if self._fs is None:  # the schema did not fit: leave no partial file
                    with contextlib.suppress(OSError):
                        sink.close()
                    with contextlib.suppress(OSError):
                        os.unlink(write_path)
                raise
        except OSError as exc:
            if self._fs is None and is_full(exc):
                raise HandoffFull(f"cannot open segment {segment_id}: {exc}") from exc
            raise HandoffError(f"cannot open segment {segment_id}: {exc}") from exc
        self._open = _OpenSegment(
            segment_id,
            final_path,
            write_path,
            sink,
            writer,
            self._clock(),
            self.covered_until,
        )
        return self._open

    def seal(self, next_offset: int) -> SegmentSealed | None:
        """Closes and publishes the open segment, which accounts for offsets up to
        ``next_offset`` (exclusive). Returns None when no segment is open."""
        segment = self._open
        if segment is None:
            # Offsets without data records so far: the next segment's span takes them.
            return None
        if next_offset <= segment.last_offset:
            raise HandoffError(
                f"segment {segment.segment_id} holds offset {segment.last_offset}; "
                f"it cannot end at {next_offset}"
            )
        self._open = None
        try:
            size = self._close_stream(segment)
            if segment.write_path != segment.final_path:
                os.rename(segment.write_path, segment.final_path)
        except OSError as exc:
            self._discard(segment)
            raise HandoffError(f"cannot seal segment {segment.segment_id}: {exc}") from exc
        return self._published(segment, size, next_offset)

    def _close_stream(self, segment: _OpenSegment) -> int:
        """Ends the IPC stream and closes the file; returns its size. With no room for
        the end marker, the stream ends where its last batch does."""
        before = int(segment.sink.tell())
        try:
            segment.writer.close()
        except OSError as exc:
            if not (self._fs is None and is_full(exc)):
                raise
            os.truncate(segment.write_path, before)
            segment.sink.close()
            return before
        size = int(segment.sink.tell())
        segment.sink.close()
        return size

    def _salvage(self, segment: _OpenSegment, size: int, next_offset: int) -> SegmentSealed | None:
        """After ENOSPC: cuts the failed write off and publishes the records before it
        (None when there were none: the file is removed)."""
        if segment.records == 0:
            self._discard(segment)
            return None
        try:
            os.truncate(segment.write_path, size)
            with contextlib.suppress(OSError):
                segment.sink.close()
            os.rename(segment.write_path, segment.final_path)
        except OSError as exc:
            self._discard(segment)
            raise HandoffError(f"cannot salvage segment {segment.segment_id}: {exc}") from exc
        log.warning(
            "%s/%d: handoff full: segment %s published at %d bytes, before offset %d",
            self.topic,
            self.partition,
            segment.segment_id,
            size,
            next_offset,
        )
        return self._published(segment, size, next_offset)

    def take_salvaged(self) -> SegmentSealed | None:
        """The segment a ``HandoffFull`` published, once."""
        salvaged, self.salvaged = self.salvaged, None
        return salvaged

    def _published(self, segment: _OpenSegment, size: int, next_offset: int) -> SegmentSealed:
        checksum = None
        if self._fs is None:
            try:
                checksum = file_checksum(segment.final_path)
            except OSError as exc:
                raise HandoffError(f"cannot read back segment {segment.segment_id}: {exc}") from exc
        self.covered_until = next_offset
        self.sealed += 1
        return SegmentSealed(
            segment_id=segment.segment_id,
            uri=self.location.uri_of(segment.final_path),
            topic=self.topic,
            partition=self.partition,
            from_offset=segment.from_offset,
            first_offset=segment.first_offset,
            last_offset=segment.last_offset,
            next_offset=next_offset,
            record_count=segment.records,
            bytes=size,
            min_timestamp=segment.min_timestamp,
            max_timestamp=segment.max_timestamp,
            checksum=checksum,
        )

    def skip_to(self, offset: int) -> None:
        """Moves the span start after an offset reset (no segment may be open)."""
        if self._open is not None:
            raise HandoffError("seal the open segment before moving the span")
        self.covered_until = offset

    def abort(self) -> None:
        """Drops the open segment and its partial file."""
        segment, self._open = self._open, None
        if segment is not None:
            self._discard(segment)

    def _discard(self, segment: _OpenSegment) -> None:
        with contextlib.suppress(Exception):
            segment.writer.close()
        with contextlib.suppress(Exception):
            segment.sink.close()
        with contextlib.suppress(OSError):
            if self._fs is None:
                os.unlink(segment.write_path)
            else:
                self._fs.delete_file(segment.write_path)

    def write_corrupt(
        self,
        *,
        first_offset: int,
        last_offset: int | None,
        raw: bytes,
        reason: str,
        kind: str,
    ) -> CorruptRangeReported:
        """Publishes a corrupt batch's raw bytes as a side file."""
        name = f"{CORRUPT_PREFIX}{first_offset:020d}-{uuid.uuid4().hex[:8]}"
        corrupt_id = f"{self.topic}/{self.partition}/{name}"
        path = self.location.path_of(corrupt_id)
        tmp = f"{self._directory}/.{name}{TMP_SUFFIX}"
        try:
            if self._fs is None:
                with os.fdopen(create_private_file(tmp), "wb") as out:
                    out.write(raw)
                os.rename(tmp, path)
            else:
                with self._fs.open_output_stream(path) as stream:
                    stream.write(raw)
        except OSError as exc:
            if self._fs is None and is_full(exc):
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise HandoffFull(f"cannot write corrupt range {corrupt_id}: {exc}") from exc
            raise HandoffError(f"cannot write corrupt range {corrupt_id}: {exc}") from exc
        return CorruptRangeReported(
            corrupt_id=corrupt_id,
            uri=self.location.uri_of(path),
            topic=self.topic,
            partition=self.partition,
            first_offset=first_offset,
            last_offset=last_offset,
            bytes=len(raw),
            reason=reason,
            kind=kind,
        )
