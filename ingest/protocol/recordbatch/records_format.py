"""RecordBatch v2 as laid out on the wire: sizes, attribute bits, control record types,
and the one control record a read_committed walk reads (``control_marker``).

Shared by the fast decoder (``records.py``) and the reference one (``records_reference.py``).
"""

from __future__ import annotations

import pyarrow as pa

from ingest.errors import DecodeError

__all__ = [
    "ATTR_CODEC_MASK",
    "ATTR_CONTROL",
    "ATTR_LOG_APPEND_TIME",
    "ATTR_TRANSACTIONAL",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "LOG_OVERHEAD",
    "V2_HEADER_SIZE",
    "control_marker",
]

V2_HEADER_SIZE = 61  # base offset .. record count
LOG_OVERHEAD = 12  # base offset and batch length: the framing the length does not count

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

ATTR_CODEC_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


def control_marker(records: bytes | bytearray | memoryview | pa.Buffer) -> int | None:
    """The type (0 ABORT, 1 COMMIT, ...) in a control batch's first record; None if empty.

    Raises DecodeError when the record or its key is malformed.
    """
    view = memoryview(records).cast("B") if not isinstance(records, memoryview) else records
    if len(view) == 0:
        return None
    pos = 0

    def varint(max_bytes: int) -> int:
        nonlocal pos
        value = 0
        mask = (1 << (32 if max_bytes == 5 else 64)) - 1
        for index in range(max_bytes):
            if pos >= len(view):
                raise DecodeError("truncated control record", field="control")
            byte = view[pos]
            pos += 1
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                value &= mask
                return (value >> 1) ^ -(value & 1)
        raise DecodeError("control record varint too long", field="control")

    length = varint(5)
    if length < 0 or length > len(view) - pos:
        raise DecodeError("control record length runs past the batch", field="control")
    end = pos + length
    view = view[:end]
    pos += 1  # attributes
    varint(10)  # timestamp delta
    varint(5)  # offset delta
    key_length = varint(5)
    if key_length < 4 or key_length > len(view) - pos:
        raise DecodeError("control record key shorter than 4 bytes", field="control")
    return int.from_bytes(view[pos + 2 : pos + 4], "big", signed=True)
