"""Kafka wire primitives: a bounds-checked ``Reader`` and ``write_*`` functions.

Decoding works over a read-only memoryview with an explicit offset, so byte
fields come back as zero-copy slices. Every decoding failure raises
``DecodeError`` carrying the offset where the bad value starts. Writers append
to a ``bytearray``; range and type errors surface as ``struct.error``,
``TypeError`` or ``OverflowError`` and are turned into ``EncodeError`` (with the
field name) by the schema engine.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from ingest.errors import DecodeError

T = TypeVar("T")

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT8 = struct.Struct(">B")
_UINT16 = struct.Struct(">H")
_UINT32 = struct.Struct(">I")
_FLOAT64 = struct.Struct(">d")

ZERO_UUID = uuid.UUID(int=0)

# Tagged fields kept as raw (tag, payload) pairs when the schema does not know the tag.
RawTaggedFields = tuple[tuple[int, bytes], ...]


class Reader:
    """Sequential reader over a memoryview; ``pos`` is the next byte to read."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None):
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        # Read-only slices cannot be mutated by a consumer holding a records view.
        self.buf = view.toreadonly()
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    # -- helpers ---------------------------------------------------------------

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _short(self, need: int, what: str) -> DecodeError:
        left = max(self.end - self.pos, 0)
        return DecodeError(f"truncated {what}: need {need} bytes, {left} left", offset=self.pos)

    def _take(self, size: int, what: str) -> memoryview:
        pos = self.pos
        stop = pos + size
        if size < 0 or stop > self.end:
            raise self._short(size, what)
        self.pos = stop
        return self.buf[pos:stop]

    def expect_end(self, what: str = "frame", field: str | None = None) -> None:
        if self.pos != self.end:
            raise DecodeError(
                f"{self.end - self.pos} unexpected trailing bytes after {what}",
                offset=self.pos,
                field=field,
            )

    def sub_reader(self, size: int, what: str) -> Reader:
        """A reader bounded to the next ``size`` bytes; this reader skips past them."""
        pos = self.pos
        if size < 0 or pos + size > self.end:
            raise self._short(size, what)
        self.pos = pos + size
        return Reader(self.buf, pos, pos + size)

    def _fixed(self, fmt: struct.Struct, what: str) -> int:
        pos = self.pos
        stop = pos + fmt.size
        if stop > self.end:
            raise self._short(fmt.size, what)
        self.pos = stop
        value: int = fmt.unpack_from(self.buf, pos)[0]
        return value

    # -- fixed-width ---------------------------------------------------------

    def int8(self) -> int:
        return self._fixed(_INT8, "int8")

    def int16(self) -> int:
        return self._fixed(_INT16, "int16")

    def int32(self) -> int:
        return self._fixed(_INT32, "int32")

    def int64(self) -> int:
        return self._fixed(_INT64, "int64")

    def uint16(self) -> int:
        return self._fixed(_UINT16, "uint16")

    def uint32(self) -> int:
        return self._fixed(_UINT32, "uint32")

    def float64(self) -> float:
        pos = self.pos
        if pos + 8 > self.end:
            raise self._short(8, "float64")
        self.pos = pos + 8
        value: float = _FLOAT64.unpack_from(self.buf, pos)[0]
        return value

    def boolean(self) -> bool:
        return self._fixed(_UINT8, "bool") != 0

    def uuid(self) -> uuid.UUID:
        raw = self._take(16, "uuid")
        return uuid.UUID(bytes=bytes(raw))

    # -- variable-length integers -------------------------------------------

    def _varint_bits(self, max_bytes: int, what: str) -> int:
        buf = self.buf
        pos = self.pos
        end = self.end
        if pos < end:
            first = buf[pos]
            if first < 0x80:
                self.pos = pos + 1
                return first
        start = pos
        value = 0
        shift = 0
        while True:
            if pos >= end:
                self.pos = start
                raise self._short(pos - start + 1, what)
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7
            if pos - start >= max_bytes:
                raise DecodeError(f"{what} longer than {max_bytes} bytes", offset=start)

    def uvarint(self) -> int:
        """Unsigned varint, at most 32 bits (Kafka's readUnsignedVarint)."""
        start = self.pos
        value = self._varint_bits(5, "unsigned varint")
        if value > 0xFFFFFFFF:
            raise DecodeError("unsigned varint exceeds 32 bits", offset=start)
        return value

    def varint(self) -> int:
        """Zigzag-encoded signed 32-bit varint."""
        start = self.pos
        raw = self._varint_bits(5, "varint")
        if raw > 0xFFFFFFFF:
            raise DecodeError("varint exceeds 32 bits", offset=start)
        return (raw >> 1) ^ -(raw & 1)

    def varlong(self) -> int:
        """Zigzag-encoded signed 64-bit varint."""
        start = self.pos
        raw = self._varint_bits(10, "varlong")
        if raw > 0xFFFFFFFFFFFFFFFF:
            raise DecodeError("varlong exceeds 64 bits", offset=start)
        return (raw >> 1) ^ -(raw & 1)

    # -- strings ---------------------------------------------------------------

    def _utf8(self, size: int, what: str) -> str:
        start = self.pos
        raw = self._take(size, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{what} is not valid UTF-8: {exc.reason}", offset=start) from None

    def _length(self, value: int, what: str, start: int) -> int:
        if value < -1:
            raise DecodeError(f"negative {what} length {value}", offset=start)
        return value

    def string(self) -> str:
        start = self.pos
        size = self._length(self.int16(), "string", start)
        if size < 0:
            raise DecodeError("null in a non-nullable string", offset=start)
        return self._utf8(size, "string")

    def nullable_string(self) -> str | None:
        start = self.pos
        size = self._length(self.int16(), "string", start)
        return None if size < 0 else self._utf8(size, "string")

    def compact_string(self) -> str:
        start = self.pos
        size = self.uvarint() - 1
        if size < 0:
            raise DecodeError("null in a non-nullable compact string", offset=start)
        return self._utf8(size, "compact string")

    def compact_nullable_string(self) -> str | None:
        size = self.uvarint() - 1
        return None if size < 0 else self._utf8(size, "compact string")

    # -- bytes (zero-copy slices) ----------------------------------------------

    def bytes_view(self) -> memoryview:
        start = self.pos
        size = self._length(self.int32(), "bytes", start)
        if size < 0:
            raise DecodeError("null in non-nullable bytes", offset=start)
        return self._take(size, "bytes")

    def nullable_bytes_view(self) -> memoryview | None:
        start = self.pos
        size = self._length(self.int32(), "bytes", start)
        return None if size < 0 else self._take(size, "bytes")

    def compact_bytes_view(self) -> memoryview:
        start = self.pos
        size = self.uvarint() - 1
        if size < 0:
            raise DecodeError("null in non-nullable compact bytes", offset=start)
        return self._take(size, "compact bytes")

    def compact_nullable_bytes_view(self) -> memoryview | None:
        size = self.uvarint() - 1
        return None if size < 0 else self._take(size, "compact bytes")

    # -- arrays ----------------------------------------------------------------

    def _count(self, count: int, start: int, min_item_size: int) -> int:
        if count < -1:
            raise DecodeError(f"negative array length {count}", offset=start)
        # Refuse absurd counts before allocating: every item needs at least one byte.
        if count * min_item_size > self.end - self.pos:
            raise DecodeError(
                f"array of {count} items cannot fit in {self.end - self.pos} bytes", offset=start
            )
        return count

    def array_length(self, min_item_size: int = 1) -> int:
        """Classic int32 array length; -1 means null."""
        start = self.pos
        return self._count(self.int32(), start, min_item_size)

    def compact_array_length(self, min_item_size: int = 1) -> int:
        """Compact (unsigned varint N+1) array length; -1 means null."""
        start = self.pos
        return self._count(self.uvarint() - 1, start, min_item_size)

    def array(self, item: Callable[[Reader], T]) -> list[T]:
        start = self.pos
        count = self.array_length()
        if count < 0:
            raise DecodeError("null in a non-nullable array", offset=start)
        return [item(self) for _ in range(count)]

    def nullable_array(self, item: Callable[[Reader], T]) -> list[T] | None:
        count = self.array_length()
        return None if count < 0 else [item(self) for _ in range(count)]

    def compact_array(self, item: Callable[[Reader], T]) -> list[T]:
        start = self.pos
        count = self.compact_array_length()
        if count < 0:
            raise DecodeError("null in a non-nullable compact array", offset=start)
        return [item(self) for _ in range(count)]

    def compact_nullable_array(self, item: Callable[[Reader], T]) -> list[T] | None:
        count = self.compact_array_length()
        return None if count < 0 else [item(self) for _ in range(count)]

    # -- tagged fields -----------------------------------------------------------

    def tagged_fields(self) -> list[tuple[int, memoryview]]:
        """The raw (tag, payload) pairs of a tagged-field section."""
        count = self.compact_array_length(min_item_size=2) + 1
        fields = []
        for _ in range(count):
            tag = self.uvarint()
            start = self.pos
            size = self.uvarint()
            if size > self.end - self.pos:
                raise DecodeError(f"tagged field {tag} of {size} bytes is truncated", offset=start)
            fields.append((tag, self._take(size, "tagged field")))
        return fields


# -- writers ---------------------------------------------------------------------


def write_int8(buf: bytearray, value: int) -> None:
    buf += _INT8.pack(value)


def write_int16(buf: bytearray, value: int) -> None:
    buf += _INT16.pack(value)


def write_int32(buf: bytearray, value: int) -> None:
    buf += _INT32.pack(value)


def write_int64(buf: bytearray, value: int) -> None:
    buf += _INT64.pack(value)


def write_uint16(buf: bytearray, value: int) -> None:
    buf += _UINT16.pack(value)


def write_uint32(buf: bytearray, value: int) -> None:
    buf += _UINT32.pack(value)


def write_float64(buf: bytearray, value: float) -> None:
    buf += _FLOAT64.pack(value)


def write_boolean(buf: bytearray, value: bool) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"expected bool, got {type(value).__name__}")
    buf.append(1 if value else 0)


def write_uuid(buf: bytearray, value: uuid.UUID) -> None:
    if not isinstance(value, uuid.UUID):
        raise TypeError(f"expected uuid.UUID, got {type(value).__name__}")
    buf += value.bytes


def _write_varint_bits(buf: bytearray, value: int) -> None:
    while value >= 0x80:
        buf.append((value & 0x7F) | 0x80)
        value >>= 7
    buf.append(value)


def write_uvarint(buf: bytearray, value: int) -> None:
    if not 0 <= value <= 0xFFFFFFFF:
        raise OverflowError(f"unsigned varint out of range: {value}")
    if value < 0x80:
        buf.append(value)
    else:
        _write_varint_bits(buf, value)


def write_varint(buf: bytearray, value: int) -> None:
    if not -(2**31) <= value < 2**31:
        raise OverflowError(f"varint out of range: {value}")
    _write_varint_bits(buf, ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def write_varlong(buf: bytearray, value: int) -> None:
    if not -(2**63) <= value < 2**63:
        raise OverflowError(f"varlong out of range: {value}")
    _write_varint_bits(buf, ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def _utf8_bytes(value: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    return value.encode("utf-8")


def write_string(buf: bytearray, value: str) -> None:
    data = _utf8_bytes(value)
    if len(data) > 0x7FFF:
        raise OverflowError(f"string of {len(data)} bytes exceeds the int16 length")
    buf += _INT16.pack(len(data))
    buf += data


def write_nullable_string(buf: bytearray, value: str | None) -> None:
    if value is None:
        buf += _INT16.pack(-1)
    else:
        write_string(buf, value)


def write_compact_string(buf: bytearray, value: str) -> None:
    data = _utf8_bytes(value)
    write_uvarint(buf, len(data) + 1)
    buf += data


def write_compact_nullable_string(buf: bytearray, value: str | None) -> None:
    if value is None:
        buf.append(0)
    else:
        write_compact_string(buf, value)


BytesLike = bytes | bytearray | memoryview


def _check_bytes(value: object) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(value).__name__}")


def write_bytes(buf: bytearray, value: BytesLike) -> None:
    _check_bytes(value)
    buf += _INT32.pack(len(value))
    buf += value


def write_nullable_bytes(buf: bytearray, value: BytesLike | None) -> None:
    if value is None:
        buf += _INT32.pack(-1)
    else:
        write_bytes(buf, value)


def write_compact_bytes(buf: bytearray, value: BytesLike) -> None:
    _check_bytes(value)
    write_uvarint(buf, len(value) + 1)
    buf += value


def write_compact_nullable_bytes(buf: bytearray, value: BytesLike | None) -> None:
    if value is None:
        buf.append(0)
    else:
        write_compact_bytes(buf, value)


def write_array_length(buf: bytearray, count: int | None) -> None:
    buf += _INT32.pack(-1 if count is None else count)


def write_compact_array_length(buf: bytearray, count: int | None) -> None:
    write_uvarint(buf, 0 if count is None else count + 1)


def write_array(
    buf: bytearray, items: Sequence[T] | None, item: Callable[[bytearray, T], None]
) -> None:
    write_array_length(buf, None if items is None else len(items))
    for value in items or ():
        item(buf, value)


def write_compact_array(
    buf: bytearray, items: Sequence[T] | None, item: Callable[[bytearray, T], None]
) -> None:
    write_compact_array_length(buf, None if items is None else len(items))
    for value in items or ():
        item(buf, value)


def write_tagged_fields(buf: bytearray, fields: Sequence[tuple[int, BytesLike]]) -> None:
    """Write a tagged-field section; ``fields`` must already be sorted by tag."""
    write_uvarint(buf, len(fields))
    previous = -1
    for tag, payload in fields:
        if tag <= previous:
            raise ValueError(f"tagged fields out of order or duplicated at tag {tag}")
        previous = tag
        write_uvarint(buf, tag)
        write_uvarint(buf, len(payload))
        buf += payload
