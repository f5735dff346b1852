"""What a poll of ``PartitionFetcher`` gives back, and the corrupt ranges of an answer
(no I/O; each range reported is logged as an error)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import CorruptBatchError
from ingest.protocol.recordbatch.records import DecodedRecords

__all__ = [
    "CorruptRange",
    "FetchResult",
    "OffsetReset",
    "UnreadableCorruption",
    "corrupt_ranges",
    "split_oversized",
]

log = logging.getLogger("ingest.worker")


@dataclass(frozen=True, slots=True)
class CorruptRange:
    """Offsets of a batch that could not be decoded, with its exact bytes."""

    first_offset: int
    last_offset: int | None
    raw: bytes
    reason: str
    kind: str


@dataclass(frozen=True, slots=True)
class OffsetReset:
    old_offset: int
    new_offset: int
    policy: str
    reason: str


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What one poll produced. ``batch`` is None when no record came back."""

    batch: pa.RecordBatch | None
    position: int
    high_watermark: int
    corrupt: tuple[CorruptRange, ...] = ()
    resets: tuple[OffsetReset, ...] = ()
    finished: bool = False
    fetched_bytes: int = 0
    # (base offset, leader epoch) where the epoch changes in this answer's batches.
    epochs: tuple[tuple[int, int], ...] = ()

    @property
    def rows(self) -> int:
        return 0 if self.batch is None else self.batch.num_rows


class UnreadableCorruption(CorruptBatchError):
    """Broken framing at the fetch position: its end cannot be read, so the rest of
    the partition cannot be reached without guessing. ``corrupt`` is the report."""

    def __init__(self, message: str, corrupt: CorruptRange) -> None:
        super().__init__(message, base_offset=corrupt.first_offset)
        self.corrupt = corrupt


def corrupt_ranges(
    decoded: DecodedRecords, fetch_offset: int, end_offset: int | None, where: str
) -> tuple[CorruptRange, ...]:
    """The corrupt batches of an answer fetched at ``fetch_offset`` to report, within the
    run (below ``end_offset``). Broken framing is left to the next Fetch when the answer
    goes on past it (it starts there and meets it again), and raised as
    ``UnreadableCorruption`` when it does not; ``where`` names the partition."""
    corrupt: list[CorruptRange] = []
    for bad in decoded.corrupt:
        first = fetch_offset if bad.base_offset is None else max(bad.base_offset, fetch_offset)
        if bad.last_offset is None:
            if decoded.next_offset is not None:
                continue  # the next Fetch starts there and meets it again
            report = CorruptRange(first, None, bad.raw, bad.reason, bad.kind)
            raise UnreadableCorruption(
                f"{where}: unreadable record batch framing at offset {first} "
                f"({bad.reason}); its end cannot be read, so it cannot be skipped",
                report,
            )
        last = bad.last_offset
        if last < fetch_offset:
            continue
        if end_offset is not None:
            if first >= end_offset:
                continue
            last = min(last, end_offset - 1)
        corrupt.append(CorruptRange(first, last, bad.raw, bad.reason, bad.kind))
        log.error(
            "%s: corrupt record batch, offsets %d-%d (%s): reported, not decoded",
            where,
            first,
            last,
            bad.reason,
        )
    return tuple(corrupt)


def split_oversized(
    batch: pa.RecordBatch, limit: int, where: str
) -> tuple[pa.RecordBatch, tuple[CorruptRange, ...]]:
    """The records of ``batch`` whose key and value hold at most ``limit`` bytes together,
    and a report for each larger one (a dead letter naming its size; its bytes are not
    kept). ``where`` names the partition. No per-record work when the key and value
    columns hold fewer bytes than ``limit`` in all (the usual answer)."""
    key, value = batch.column("key"), batch.column("value")
    if key.nbytes + value.nbytes <= limit:
        return batch, ()
    sizes = pc.add(
        pc.fill_null(pc.binary_length(value), 0),
        pc.fill_null(pc.binary_length(key), 0),
    )
    largest = pc.max(sizes).as_py()
    if largest is None or largest <= limit:
        return batch, ()
    over = pc.greater(sizes, limit)
    offsets = pc.filter(batch.column("offset"), over).to_pylist()
    reports = []
    for offset, size in zip(offsets, pc.filter(sizes, over).to_pylist(), strict=True):
        reason = f"record of {size} bytes (key and value) exceeds fetch.max_record_bytes ({limit})"
        reports.append(CorruptRange(offset, offset, b"", reason, "oversized"))
        log.error("%s: offset %d: %s: reported, not landed", where, offset, reason)
    return batch.filter(pc.invert(over)), tuple(reports)
