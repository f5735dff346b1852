"""A plain, record-at-a-time RecordBatch v2 decoder: the yardstick for ``records.py``.

It follows the same rules as the fast decoder (see ``records.py``) with none of
its machinery: Python ints, a pure-Python CRC32C, one loop per batch and per
record, Kafka's read_committed algorithm written as the Java consumer does it.
Tests check that both decoders agree on every input; it is far too slow for
production (about 100x).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from ingest.errors import DecodeError
from ingest.protocol.recordbatch.compression import Codec, decompress
from ingest.protocol.recordbatch.records import (
    ATTR_CODEC_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    CONTROL_ABORT,
    DEFAULT_MAX_BATCH_BYTES,
    RECORD_SCHEMA,
    BatchStatus,
    CorruptBatch,
    CorruptKind,
    DecodedRecords,
    RecordError,
    bound_skipped_batches,
    control_marker,
    record_error_reason,
    status_reason,
)
from ingest.protocol.recordbatch.transactions import UnlistedAbort

_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_FRAMING = struct.Struct(">qi")

_CRC_TABLE: list[int] = []


def crc32c_python(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """Table-driven CRC32C, one byte at a time."""
    if not _CRC_TABLE:
        for index in range(256):
            value = index
            for _ in range(8):
                value = (value >> 1) ^ 0x82F63B78 if value & 1 else value >> 1
            _CRC_TABLE.append(value)
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _wrap64(value: int) -> int:
    return ((value + 2**63) % 2**64) - 2**63


class _RecordFailure(Exception):
    def __init__(self, error: RecordError, record: int) -> None:
        self.error = error
        self.record = record


class _Cursor:
    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end

    def varint(self, bits: int, record: int, overrun: RecordError = RecordError.OVERRUN) -> int:
        value = 0
        shift = 0
        while True:
            if self.pos >= self.end:
                raise _RecordFailure(overrun, record)
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > (28 if bits == 32 else 63):  # Kafka: at most 5 or 10 bytes
                raise _RecordFailure(RecordError.VARINT, record)
        value &= (1 << bits) - 1
        return (value >> 1) ^ -(value & 1)

    def take(self, size: int, record: int) -> bytes:
        if size > self.end - self.pos:
            raise _RecordFailure(RecordError.OVERRUN, record)
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out


class _Batch:
    """One v2 batch with intact framing and a sane header."""

    def __init__(self, data: bytes, position: int) -> None:
        (
            self.base_offset,
            self.length,
            self.leader_epoch,
            _magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            _producer_epoch,
            _base_sequence,
            self.record_count,
        ) = _V2_HEADER.unpack_from(data, position)
        self.position = position
        self.size = self.length + 12
        self.raw = data[position : position + self.size]
        self.last_offset = _wrap64(self.base_offset + self.last_offset_delta)

    @property
    def records(self) -> bytes:
        return self.raw[_V2_HEADER.size :]


def _decode_batch_records(
    payload: bytes, batch: _Batch, fetch_offset: int | None
) -> list[dict[str, Any]]:
    log_append = bool(batch.attributes & ATTR_LOG_APPEND_TIME)
    rows: list[dict[str, Any]] = []
    cursor = _Cursor(payload, 0, len(payload))
    previous_delta = -1
    for index in range(batch.record_count):
        if cursor.pos >= len(payload):
            raise _RecordFailure(RecordError.MISSING_RECORD, index)
        cursor.end = len(payload)
        length = cursor.varint(32, index, overrun=RecordError.RECORD_LENGTH)
        if length < 0 or length > len(payload) - cursor.pos:
            raise _RecordFailure(RecordError.RECORD_LENGTH, index)
        record_end = cursor.pos + length
        cursor.end = record_end
        cursor.take(1, index)  # attributes
        timestamp_delta = cursor.varint(64, index)
        offset_delta = cursor.varint(32, index)
        if offset_delta <= previous_delta or offset_delta > batch.last_offset_delta:
            raise _RecordFailure(RecordError.OFFSET_DELTA, index)
        previous_delta = offset_delta
        key_length = cursor.varint(32, index)
        key = cursor.take(key_length, index) if key_length >= 0 else None
        value_length = cursor.varint(32, index)
        value = cursor.take(value_length, index) if value_length >= 0 else None
        header_count = cursor.varint(32, index)
        if header_count < 0:
            raise _RecordFailure(RecordError.HEADER_COUNT, index)
        headers = []
        for _ in range(header_count):
            name_length = cursor.varint(32, index)
            if name_length < 0:
                raise _RecordFailure(RecordError.HEADER_KEY, index)
            name = cursor.take(name_length, index)
            header_length = cursor.varint(32, index)
            header_value = cursor.take(header_length, index) if header_length >= 0 else None
            headers.append({"key": name.decode("utf-8", "replace"), "value": header_value})
        if cursor.pos != record_end:
            raise _RecordFailure(RecordError.RECORD_SIZE, index)
        offset = _wrap64(batch.base_offset + offset_delta)
        if fetch_offset is not None and offset < fetch_offset:
            continue
        rows.append(
            {
                "offset": offset,
                "timestamp": (
                    batch.max_timestamp
                    if log_append
                    else _wrap64(batch.base_timestamp + timestamp_delta)
                ),
                "timestamp_type": 1 if log_append else 0,
                "key": key,
                "value": value,
                "headers": headers,
            }
        )
    if cursor.pos != len(payload):
        raise _RecordFailure(RecordError.TRAILING, batch.record_count)
    return rows


def decode_records_reference(
    records: bytes | bytearray | memoryview,
    *,
    topic: str,
    partition: int,
    read_committed: bool = False,
    aborted_transactions: Sequence[tuple[int, int]] | None = None,
    fetch_offset: int | None = None,
    check_crc: bool = False,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    carried: Mapping[int, int] | None = None,
) -> DecodedRecords:
    """Same contract as ``records.decode_records``."""
    data = bytes(records)
    corrupt: list[CorruptBatch] = []
    batches: list[_Batch] = []
    last_offsets: list[int] = []
    incomplete: int | None = None

    def report(
        status: BatchStatus, position: int, size: int, *, last_offset: int | None, **fields: int
    ) -> None:
        kind, reason = status_reason(status, position=position, **fields)
        base = _FRAMING.unpack_from(data, position)[0]
        corrupt.append(
            CorruptBatch(
                base, last_offset, data[position : position + size], reason, kind, position
            )
        )

    pos = 0
    while len(data) - pos >= 12:
        base_offset, length = _FRAMING.unpack_from(data, pos)
        remaining = len(data) - pos
        magic = struct.unpack_from(">b", data, pos + 16)[0] if remaining > 16 else -1
        if length < 14:
            report(
                BatchStatus.BROKEN_FRAMING, pos, remaining, last_offset=None,
                base_offset=base_offset, length=length, magic=magic,
            )  # fmt: skip
            break
        if length + 12 > remaining:
            if remaining > 16 and data[pos + 16] > 2:
                report(
                    BatchStatus.BROKEN_FRAMING, pos, remaining, last_offset=None,
                    base_offset=base_offset, length=length, magic=magic,
                )  # fmt: skip
            else:
                incomplete = length + 12
            break
        size = length + 12
        common = {"base_offset": base_offset, "length": length, "magic": magic}
        if magic in (0, 1):
            report(BatchStatus.OLD_MAGIC, pos, size, last_offset=base_offset, **common)
            last_offsets.append(base_offset)
        elif magic != 2:
            report(BatchStatus.UNKNOWN_MAGIC, pos, size, last_offset=None, **common)
        elif length < _V2_HEADER.size - 12:
            report(BatchStatus.SHORT_BATCH, pos, size, last_offset=None, **common)
        else:
            batch = _Batch(data, pos)
            last_offsets.append(batch.last_offset)
            status = BatchStatus.OK
            computed = 0
            if check_crc:
                computed = crc32c_python(batch.raw[21:])
            if check_crc and computed != batch.crc:
                status = BatchStatus.CRC_MISMATCH
            elif batch.attributes & ATTR_CODEC_MASK > 4:
                status = BatchStatus.BAD_CODEC
            elif batch.record_count < 0:
                status = BatchStatus.BAD_RECORD_COUNT
            elif batch.last_offset_delta < 0:
                status = BatchStatus.BAD_LAST_OFFSET_DELTA
            if status == BatchStatus.OK:
                batches.append(batch)
            else:
                report(
                    status, pos, size, last_offset=batch.last_offset,
                    attributes=batch.attributes, record_count=batch.record_count,
                    crc_stored=batch.crc, crc_computed=computed, **common,
                )  # fmt: skip
        pos += size

    next_offset = max(last_offsets) + 1 if last_offsets else None
    if next_offset is not None and fetch_offset is not None:
        next_offset = max(next_offset, fetch_offset)

    late: list[CorruptBatch] = []  # found after the framing pass

    def report_batch(batch: _Batch, reason: str, kind: CorruptKind) -> None:
        late.append(
            CorruptBatch(
                batch.base_offset, batch.last_offset, batch.raw, reason, kind, batch.position
            )
        )

    def payload_of(batch: _Batch) -> bytes:
        return bytes(
            decompress(
                Codec(batch.attributes & ATTR_CODEC_MASK), batch.records, max_size=max_batch_bytes
            )
        )

    # Kafka's read_committed walk, as in the Java consumer, plus the checks of a broker's
    # side (transactions.py): an ABORT marker after kept data of its producer drops that
    # data, or, when an earlier answer handed it on, is reported as carried.
    pending = sorted(aborted_transactions or (), key=lambda txn: txn[1])
    aborted_producers: set[int] = set()
    dropped: set[int] = set()
    undecided: dict[int, list[_Batch]] = {}  # producer -> kept batches since its marker
    still_open = dict(carried or {})
    unlisted: list[UnlistedAbort] = []
    carried_aborts: list[UnlistedAbort] = []
    for batch in batches:
        if read_committed and batch.producer_id >= 0:
            while pending and pending[0][1] <= batch.last_offset:
                aborted_producers.add(pending.pop(0)[0])
            if batch.attributes & ATTR_CONTROL:
                try:
                    marker = control_marker(payload_of(batch))
                except DecodeError as exc:
                    report_batch(batch, f"bad control record: {exc.reason}", "control")
                    continue
                if marker is None:
                    continue
                if marker == CONTROL_ABORT:
                    aborted_producers.discard(batch.producer_id)
                if fetch_offset is not None and batch.base_offset < fetch_offset:
                    continue
                kept = undecided.pop(batch.producer_id, [])
                earlier = still_open.pop(batch.producer_id, None)
                if marker == CONTROL_ABORT:
                    if earlier is not None:
                        carried_aborts.append(
                            UnlistedAbort(batch.producer_id, earlier, batch.base_offset)
                        )
                    if kept:
                        first = kept[0].base_offset
                        if fetch_offset is not None:
                            first = max(first, fetch_offset)
                        unlisted.append(UnlistedAbort(batch.producer_id, first, batch.base_offset))
                        dropped.update(b.position for b in kept)
            elif batch.attributes & ATTR_TRANSACTIONAL:
                if batch.producer_id in aborted_producers:
                    dropped.add(batch.position)
                elif fetch_offset is None or batch.last_offset >= fetch_offset:
                    undecided.setdefault(batch.producer_id, []).append(batch)
    for producer_id, kept in undecided.items():
        first = kept[0].base_offset
        if fetch_offset is not None:
            first = max(first, fetch_offset)
        still_open.setdefault(producer_id, first)

    rows: list[dict[str, Any]] = []
    for batch in batches:
        if batch.attributes & ATTR_CONTROL or batch.position in dropped:
            continue
        if fetch_offset is not None and batch.last_offset < fetch_offset:
            continue
        try:
            payload = payload_of(batch)
        except DecodeError as exc:
            report_batch(batch, f"decompression failed: {exc.reason}", "decompression")
            continue
        try:
            rows.extend(_decode_batch_records(payload, batch, fetch_offset))
        except _RecordFailure as failure:
            reason = record_error_reason(failure.error, failure.record, batch.record_count)
            report_batch(batch, reason, "structure")

    everything = sorted(corrupt + late, key=lambda item: item.position)
    epochs: list[tuple[int, int]] = []
    for batch in batches:
        if not epochs or epochs[-1][1] != batch.leader_epoch:
            epochs.append((batch.base_offset, batch.leader_epoch))
    return DecodedRecords(
        batch=_to_arrow(rows, topic, partition),
        next_offset=next_offset,
        incomplete_batch_size=incomplete,
        corrupt=bound_skipped_batches(memoryview(data), everything),
        unlisted_aborts=tuple(unlisted),
        carried_aborts=tuple(carried_aborts),
        open_transactions=tuple(sorted(still_open.items())) if read_committed else (),
        epochs=tuple(epochs),
    )


def _to_arrow(rows: list[dict[str, Any]], topic: str, partition: int) -> pa.RecordBatch:
    count = len(rows)
    columns = [
        pa.DictionaryArray.from_arrays(
            pa.array([0] * count, pa.int32()), pa.array([topic], pa.string())
        ),
        pa.array([partition] * count, pa.int32()),
    ]
    for name in ("offset", "timestamp", "timestamp_type", "key", "value", "headers"):
        columns.append(pa.array([row[name] for row in rows], RECORD_SCHEMA.field(name).type))
    return pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)
