"""What a worker tells its parent about the handoff: sealed segments and corrupt ranges.

Plain frozen dataclasses, so they pickle over a ``multiprocessing`` pipe.
Offsets are Kafka offsets; timestamps are milliseconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CorruptRangeReported", "SegmentSealed"]


@dataclass(frozen=True, slots=True)
class SegmentSealed:
    """One sealed Arrow IPC stream of one partition's records, ready to be read.

    The segment accounts for the offsets ``[from_offset, next_offset)``: every
    record in that span is in it, except the offsets Kafka holds no data record
    for (control batches, aborted transactions, compacted records) and the
    corrupt ranges reported separately. Consecutive segments of a partition
    tile the offsets: one's ``next_offset`` is the next one's ``from_offset``,
    unless an offset reset came between them.
    """

    segment_id: str
    uri: str
    topic: str
    partition: int
    from_offset: int
    first_offset: int
    last_offset: int
    next_offset: int
    record_count: int
    bytes: int
    min_timestamp: int
    max_timestamp: int
    # The partition leader epoch of the batch holding ``next_offset - 1`` (KIP-320): the
    # OffsetCommit of ``next_offset`` carries it. -1: unknown.
    leader_epoch: int = -1
    # CRC-32C of a local segment file, checked before it is parsed
    # (``store.read_segment``); None for an object-store segment (not mapped, and the
    # store checks its own uploads).
    checksum: int | None = None


@dataclass(frozen=True, slots=True)
class CorruptRangeReported:
    """A record batch that could not be decoded, kept for the dead-letter table.

    ``uri`` is a side file holding the batch's exact bytes. ``last_offset`` is
    None when the batch framing was too broken to read it.
    """

    corrupt_id: str
    uri: str
    topic: str
    partition: int
    first_offset: int
    last_offset: int | None
    bytes: int
    reason: str
    kind: str
