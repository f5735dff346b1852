"""Corrupt batches: what is reported for a batch that cannot be decoded, and why.

The framing scan's and the record parser's codes (``BatchStatus``, ``RecordError``, the
``ST_*`` and ``E_*`` of ``_records.c``) become a ``CorruptBatch``: its raw bytes, its
offset range and a reason. The texts are shared with the reference decoder, so both
report the same words. Corrupt batches are reported, never raised or skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

from ingest.protocol.recordbatch.records_format import ATTR_CODEC_MASK

__all__ = [
    "BatchStatus",
    "CorruptBatch",
    "CorruptKind",
    "RecordError",
    "bound_skipped_batches",
    "corrupt_from_entry",
    "record_error_reason",
    "scan_corrupt",
    "status_reason",
]


class BatchStatus(IntEnum):
    """What the framing scan found in one batch (``ST_*`` in _records.c)."""

    OK = 0
    CRC_MISMATCH = 1
    OLD_MAGIC = 2
    UNKNOWN_MAGIC = 3
    SHORT_BATCH = 4
    BAD_CODEC = 5
    BAD_RECORD_COUNT = 6
    BAD_LAST_OFFSET_DELTA = 7
    BROKEN_FRAMING = 8
    INCOMPLETE = 9


class RecordError(IntEnum):
    """Why a batch's records failed to parse (``E_*`` in _records.c)."""

    MISSING_RECORD = 1
    RECORD_LENGTH = 2
    VARINT = 3
    OVERRUN = 4
    OFFSET_DELTA = 5
    HEADER_COUNT = 6
    HEADER_KEY = 7
    RECORD_SIZE = 8
    TRAILING = 9


CorruptKind = Literal[
    "crc", "magic", "structure", "framing", "decompression", "control", "oversized"
]


@dataclass(frozen=True)
class CorruptBatch:
    """A batch (or, for broken framing, the rest of the buffer) that could not be decoded.

    ``raw`` holds its exact bytes, framing included, for the dead-letter table.
    ``last_offset`` is None when it could not be read.
    """

    base_offset: int | None
    last_offset: int | None
    raw: bytes
    reason: str
    kind: CorruptKind
    position: int  # byte position of the batch in the records buffer


def status_reason(
    status: int,
    *,
    base_offset: int,
    position: int,
    length: int,
    magic: int,
    attributes: int = 0,
    record_count: int = 0,
    crc_stored: int = 0,
    crc_computed: int = 0,
) -> tuple[CorruptKind, str]:
    """The kind and reason of a batch the framing scan rejected."""
    if status == BatchStatus.CRC_MISMATCH:
        return "crc", f"CRC mismatch: stored 0x{crc_stored:08x}, computed 0x{crc_computed:08x}"
    if status == BatchStatus.OLD_MAGIC:
        return "magic", f"unsupported magic v0/v1 at offset {base_offset}"
    if status == BatchStatus.UNKNOWN_MAGIC:
        return "magic", f"unknown magic {magic} at offset {base_offset}"
    if status == BatchStatus.SHORT_BATCH:
        return "structure", f"bad structure: batch length {length} is shorter than the v2 header"
    if status == BatchStatus.BAD_CODEC:
        codec = attributes & ATTR_CODEC_MASK
        return "structure", f"bad structure: unknown compression codec {codec}"
    if status == BatchStatus.BAD_RECORD_COUNT:
        return "structure", f"bad structure: negative record count {record_count}"
    if status == BatchStatus.BAD_LAST_OFFSET_DELTA:
        return "structure", "bad structure: negative last offset delta"
    if status == BatchStatus.BROKEN_FRAMING:
        if length < 14:
            return "framing", (
                f"broken framing: batch length {length} at byte {position}; "
                "the rest of the buffer is unreadable"
            )
        return "framing", f"broken framing: truncated batch with unknown magic {magic}"
    raise AssertionError(f"status {status} is not a corrupt batch")


def record_error_reason(error: int, record: int, record_count: int) -> str:
    """The reason a batch's records failed to parse."""
    kind = RecordError(error)
    text = {
        RecordError.MISSING_RECORD: f"batch declares {record_count} records but holds {record}",
        RecordError.RECORD_LENGTH: f"record {record} length runs past the end of the batch",
        RecordError.VARINT: f"record {record} has a varint longer than Kafka allows",
        RecordError.OVERRUN: f"record {record} has a field past its length",
        RecordError.OFFSET_DELTA: (
            f"record {record} offset delta is not increasing or exceeds the last offset delta"
        ),
        RecordError.HEADER_COUNT: f"record {record} has a negative header count",
        RecordError.HEADER_KEY: f"record {record} has a negative header key length",
        RecordError.RECORD_SIZE: f"record {record} fields end before its declared length",
        RecordError.TRAILING: f"bytes left after the last of {record_count} records",
    }[kind]
    return f"bad structure: {text}"


def corrupt_from_entry(
    view: memoryview, entry: Any, reason: str, kind: CorruptKind
) -> CorruptBatch:
    """The report of the batch at ``entry`` (a row of the scan's header table)."""
    start = int(entry["start"])
    size = int(entry["size"])
    return CorruptBatch(
        base_offset=int(entry["base_offset"]),
        last_offset=int(entry["last_offset"]) if entry["has_last_offset"] else None,
        raw=bytes(view[start : start + size]),
        reason=reason,
        kind=kind,
        position=start,
    )


def scan_corrupt(view: memoryview, entry: Any) -> CorruptBatch:
    """The report of a batch the framing scan rejected (``entry["status"]`` not OK)."""
    kind, reason = status_reason(
        int(entry["status"]),
        base_offset=int(entry["base_offset"]),
        position=int(entry["start"]),
        length=int(entry["length"]),
        magic=int(entry["magic"]),
        attributes=int(entry["attributes"]),
        record_count=int(entry["record_count"]),
        crc_stored=int(entry["crc_stored"]),
        crc_computed=int(entry["crc_computed"]),
    )
    return corrupt_from_entry(view, entry, reason, kind)


def bound_skipped_batches(
    view: memoryview, corrupt: Sequence[CorruptBatch]
) -> tuple[CorruptBatch, ...]:
    """Gives a last offset to corrupt batches skipped by their length whose own header
    cannot say it (unknown magic, too short): the next batch's base offset - 1.

    Without it their offsets would be passed over unreported once a later batch moves
    the position on. Like any corrupt batch's range, it rests on unverified framing."""
    bounded: list[CorruptBatch] = []
    for bad in corrupt:
        following = bad.position + len(bad.raw)
        if (
            bad.last_offset is None
            and bad.kind != "framing"
            and bad.base_offset is not None
            and len(view) - following >= 12
        ):
            next_base = int.from_bytes(view[following : following + 8], "big", signed=True)
            if next_base > bad.base_offset:
                bad = dataclasses.replace(bad, last_offset=next_base - 1)
        bounded.append(bad)
    return tuple(bounded)
