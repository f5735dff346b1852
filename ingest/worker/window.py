"""Cutting a decoded answer to the run's window: pure functions over ``RECORD_SCHEMA``
batches (offsets ascending), no copy of the records (``slice``).

* ``skip_before_timestamp``: the start of a timestamp run, corrected where the
  broker's ListOffsets answer was early (``positions.skip_until_timestamp``).
* ``cut_at_end``: an end offset; ``cut_at_timestamp``: an end timestamp, which
  becomes the end offset once a record at or after it is seen.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ingest.protocol.recordbatch.records import OFFSET_COLUMN, TIMESTAMP_COLUMN, int64_values

__all__ = ["Skipped", "cut_at_end", "cut_at_timestamp", "skip_before_timestamp"]

log = logging.getLogger("ingest.worker")


class Skipped(NamedTuple):
    """What ``skip_before_timestamp`` left of a batch."""

    batch: pa.RecordBatch
    # A record at or after the timestamp was found: the skip is over.
    reached: bool
    # First and last offset dropped before that record; None when none was.
    dropped: tuple[int, int] | None


def skip_before_timestamp(
    batch: pa.RecordBatch, timestamp: int, where: str | None = None
) -> Skipped:
    """Drops the records before the first one timestamped at or after ``timestamp``
    (logged at info level when ``where`` names the partition).

    "Until the first match" rather than "every record below": with timestamps out
    of order, everything after the start record is kept, as Kafka's start means.
    With no match the whole batch is dropped and the skip goes on in the next one.
    """
    timestamps = int64_values(batch.column(TIMESTAMP_COLUMN))
    hits = np.flatnonzero(timestamps >= timestamp)
    if len(hits) == 0:
        return Skipped(batch.slice(0, 0), False, None)
    first = int(hits[0])
    if not first:
        return Skipped(batch.slice(first), True, None)
    offsets = int64_values(batch.column(OFFSET_COLUMN))
    dropped = (int(offsets[0]), int(offsets[first - 1]))
    if where is not None:
        log.info(
            "%s: skipped offsets %d-%d, timestamped before %d (the start timestamp)",
            where,
            *dropped,
            timestamp,
        )
    return Skipped(batch.slice(first), True, dropped)


def cut_at_end(batch: pa.RecordBatch, position: int, end_offset: int) -> tuple[pa.RecordBatch, int]:
    """The records below ``end_offset`` and the position after them."""
    if position <= end_offset:
        return batch, position
    offsets = int64_values(batch.column(OFFSET_COLUMN))
    keep = int(np.searchsorted(offsets, end_offset))
    return batch.slice(0, keep), end_offset


def cut_at_timestamp(
    batch: pa.RecordBatch, position: int, end_timestamp: int
) -> tuple[pa.RecordBatch, int, bool]:
    """The records before the first one timestamped at or after ``end_timestamp``, the
    position after them, and whether that record was found (its offset, the returned
    position, is then the run's end)."""
    timestamps = int64_values(batch.column(TIMESTAMP_COLUMN))
    hits = np.flatnonzero(timestamps >= end_timestamp)
    if len(hits) == 0:
        return batch, position, False
    cut = int(hits[0])
    end = int(int64_values(batch.column(OFFSET_COLUMN))[cut])
    return batch.slice(0, cut), end, True
