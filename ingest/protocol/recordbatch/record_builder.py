"""An encoder of Kafka RecordBatch v2, for tests, benchmarks and scripted peers.

It writes what a producer (or a broker) would: any codec, transactional and
control batches, CreateTime or LogAppendTime, explicit offsets and timestamps,
headers, null keys and values. Everything a broker could get wrong can be set
by hand too (offset deltas, last offset delta, record count, CRC), so tests can
build malformed batches on purpose.

Layout (all integers big-endian; varints are zigzag LEB128)::

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8 (2)
    crc uint32 (CRC32C of everything after it) | attributes int16 | last_offset_delta int32
    base_timestamp int64 | max_timestamp int64 | producer_id int64 | producer_epoch int16
    base_sequence int32 | record_count int32 | records...

    record: length varint | attributes int8 | timestamp_delta varlong | offset_delta varint
            key_length varint | key | value_length varint | value
            header_count varint | (key_length varint | key | value_length varint | value)*
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ingest.protocol.recordbatch._records import crc32c
from ingest.protocol.recordbatch.compression import Codec, codec_from_name, compress

HeaderList = Sequence[tuple[str | bytes, bytes | None]]

_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_START = 21  # CRC covers attributes .. end
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch

ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40


@dataclass(frozen=True)
class Record:
    """One record to encode. ``timestamp`` is absolute (ms); ``offset_delta`` defaults
    to the record's index in the batch."""

    value: bytes | None
    key: bytes | None = None
    headers: HeaderList = field(default_factory=tuple)
    timestamp: int | None = None
    offset_delta: int | None = None
    attributes: int = 0


def zigzag_varint(value: int, bits: int = 32) -> bytes:
    """Kafka's varint (bits=32) or varlong (bits=64)."""
    limit = 1 << (bits - 1)
    if not -limit <= value < limit:
        raise ValueError(f"{value} does not fit a {bits}-bit varint")
    zigzag = ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _sized(data: bytes | None) -> bytes:
    if data is None:
        return zigzag_varint(-1)
    return zigzag_varint(len(data)) + data


def encode_record(record: Record, *, offset_delta: int, timestamp_delta: int) -> bytes:
    """One record with its length prefix."""
    body = bytearray()
    body.append(record.attributes & 0xFF)
    body += zigzag_varint(timestamp_delta, 64)
    body += zigzag_varint(offset_delta)
    body += _sized(record.key)
    body += _sized(record.value)
    body += zigzag_varint(len(record.headers))
    for name, value in record.headers:
        body += _sized(name.encode() if isinstance(name, str) else name)
        body += _sized(value)
    return zigzag_varint(len(body)) + bytes(body)


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    compression: Codec | int | Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none",
    snappy_framing: Literal["xerial", "raw"] = "xerial",
    log_append_time: int | None = None,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    transactional: bool = False,
    control: bool = False,
    delete_horizon: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    last_offset_delta: int | None = None,
    record_count: int | None = None,
    crc: int | None = None,
    extra_attributes: int = 0,
    magic: int = 2,
) -> bytes:
    """One RecordBatch v2, framing included.

    Timestamps: ``base_timestamp`` defaults to the first record's timestamp (records
    without one take it); ``max_timestamp`` to the largest, or to ``log_append_time``,
    which also sets the LogAppendTime attribute. ``crc``, ``record_count``,
    ``last_offset_delta`` and ``magic`` override the computed fields.
    """
    codec = codec_from_name(compression) if isinstance(compression, str) else Codec(compression)
    stamps = [r.timestamp for r in records if r.timestamp is not None]
    first = base_timestamp if base_timestamp is not None else (stamps[0] if stamps else 0)
    deltas = [r.offset_delta if r.offset_delta is not None else i for i, r in enumerate(records)]
    body = b"".join(
        encode_record(
            record,
            offset_delta=delta,
            timestamp_delta=(record.timestamp if record.timestamp is not None else first) - first,
        )
        for record, delta in zip(records, deltas, strict=True)
    )
    if codec != Codec.NONE:
        body = compress(codec, body, snappy_framing=snappy_framing)
    attributes = int(codec) | extra_attributes
    if log_append_time is not None:
        attributes |= ATTR_LOG_APPEND_TIME
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    if control:
        attributes |= ATTR_CONTROL
    if delete_horizon:
        attributes |= ATTR_DELETE_HORIZON
    if max_timestamp is None:
        if log_append_time is not None:
            max_timestamp = log_append_time
        else:
            max_timestamp = max(stamps, default=first) if stamps else first
    if last_offset_delta is None:
        last_offset_delta = max(deltas, default=0)
    header = _HEADER.pack(
        base_offset,
        _HEADER.size - 12 + len(body),
        partition_leader_epoch,
        magic,
        0,
        attributes,
        last_offset_delta,
        first,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records) if record_count is None else record_count,
    )
    batch = bytearray(header + body)
    checksum = crc32c(memoryview(batch)[_CRC_START:]) if crc is None else crc
    struct.pack_into(">I", batch, 17, checksum)
    return bytes(batch)


def control_batch(
    marker: Literal["abort", "commit"],
    *,
    base_offset: int,
    producer_id: int,
    producer_epoch: int = 0,
    coordinator_epoch: int = 0,
    timestamp: int = 0,
) -> bytes:
    """A transaction marker, as the transaction coordinator writes it."""
    kind = 0 if marker == "abort" else 1
    record = Record(
        key=_CONTROL_KEY.pack(0, kind),
        value=_CONTROL_VALUE.pack(0, coordinator_epoch),
        timestamp=timestamp,
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        transactional=True,
        control=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )


def legacy_message(
    offset: int,
    value: bytes | None,
    *,
    key: bytes | None = None,
    magic: int = 1,
    timestamp: int = 0,
) -> bytes:
    """One uncompressed magic v0/v1 message (the pre-0.11 format), framing included."""
    body = bytearray()
    body.append(magic)
    body.append(0)  # attributes
    if magic >= 1:
        body += struct.pack(">q", timestamp)
    for part in (key, value):
        body += struct.pack(">i", -1) if part is None else struct.pack(">i", len(part)) + part
    message = struct.pack(">I", zlib.crc32(body)) + bytes(body)
    return struct.pack(">qi", offset, len(message)) + message
