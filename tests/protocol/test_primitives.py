"""Wire primitives: known encodings, bounds, and failures that name their offset."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.errors import DecodeError
from ingest.protocol import primitives as p
from ingest.protocol.primitives import Reader


def written(write: object, *values: object) -> bytes:
    buf = bytearray()
    write(buf, *values)  # type: ignore[operator]
    return bytes(buf)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "02"),
        (-1, "01"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (300, "d804"),
        (2**31 - 1, "feffffff0f"),
        (-(2**31), "ffffffff0f"),
    ],
)
def test_varint_zigzag_vectors(value: int, encoded: str) -> None:
    assert written(p.write_varint, value).hex() == encoded
    assert Reader(bytes.fromhex(encoded)).varint() == value


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(0, "00"), (127, "7f"), (128, "8001"), (300, "ac02"), (2**32 - 1, "ffffffff0f")],
)
def test_unsigned_varint_vectors(value: int, encoded: str) -> None:
    assert written(p.write_uvarint, value).hex() == encoded
    r = Reader(bytes.fromhex(encoded))
    assert r.uvarint() == value
    assert r.remaining == 0


def test_varlong_extremes() -> None:
    for value in (0, -1, 2**63 - 1, -(2**63), 1234567890123):
        data = written(p.write_varlong, value)
        assert Reader(data).varlong() == value
    assert written(p.write_varlong, -(2**63)).hex() == "ffffffffffffffffff01"


@given(st.integers(-(2**63), 2**63 - 1))
@settings(max_examples=200)
def test_varlong_round_trip(value: int) -> None:
    assert Reader(written(p.write_varlong, value)).varlong() == value


@given(st.integers(-(2**31), 2**31 - 1))
@settings(max_examples=200)
def test_varint_round_trip(value: int) -> None:
    assert Reader(written(p.write_varint, value)).varint() == value


def test_overlong_varints_are_rejected() -> None:
    with pytest.raises(DecodeError) as excinfo:
        Reader(b"\x80\x80\x80\x80\x80\x01").uvarint()
    assert excinfo.value.offset == 0
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff\x7f").uvarint()  # 35 bits
    with pytest.raises(DecodeError):
        Reader(b"\x80" * 10 + b"\x01").varlong()


def test_fixed_width_values_and_byte_order() -> None:
    buf = bytearray()
    p.write_int8(buf, -2)
    p.write_int16(buf, -3)
    p.write_int32(buf, 0x01020304)
    p.write_int64(buf, -(2**63))
    p.write_uint16(buf, 65535)
    p.write_uint32(buf, 2**32 - 1)
    p.write_float64(buf, 1.5)
    p.write_boolean(buf, True)
    assert buf.hex() == "fefffd010203048000000000000000ffffffffffff3ff800000000000001"
    r = Reader(buf)
    assert [r.int8(), r.int16(), r.int32(), r.int64(), r.uint16(), r.uint32()] == [
        -2, -3, 0x01020304, -(2**63), 65535, 2**32 - 1,
    ]  # fmt: skip
    assert r.float64() == 1.5
    assert r.boolean() is True
    r.expect_end()


def test_out_of_range_writes_fail() -> None:
    with pytest.raises(struct.error):
        p.write_int16(bytearray(), 2**15)
    with pytest.raises(OverflowError):
        p.write_uvarint(bytearray(), -1)
    with pytest.raises(OverflowError):
        p.write_varint(bytearray(), 2**31)
    with pytest.raises(TypeError):
        p.write_boolean(bytearray(), 1)  # type: ignore[arg-type]


def test_strings_classic_and_compact() -> None:
    assert written(p.write_string, "hé").hex() == "0003" + "68c3a9"
    assert written(p.write_nullable_string, None).hex() == "ffff"
    assert written(p.write_compact_string, "hé").hex() == "04" + "68c3a9"
    assert written(p.write_compact_nullable_string, None).hex() == "00"
    assert Reader(bytes.fromhex("000368c3a9")).string() == "hé"
    assert Reader(bytes.fromhex("ffff")).nullable_string() is None
    assert Reader(bytes.fromhex("0468c3a9")).compact_string() == "hé"
    assert Reader(bytes.fromhex("00")).compact_nullable_string() is None
    with pytest.raises(DecodeError, match="null"):
        Reader(bytes.fromhex("ffff")).string()
    with pytest.raises(DecodeError, match="null"):
        Reader(bytes.fromhex("00")).compact_string()
    with pytest.raises(DecodeError, match="UTF-8"):
        Reader(bytes.fromhex("0001ff")).string()
    with pytest.raises(DecodeError, match="negative"):
        Reader(bytes.fromhex("fffe")).nullable_string()
    with pytest.raises(OverflowError):
        p.write_string(bytearray(), "x" * 40000)


def test_bytes_are_zero_copy_read_only_slices() -> None:
    data = bytearray(written(p.write_bytes, b"payload") + written(p.write_compact_bytes, b"xy"))
    r = Reader(data)
    first = r.bytes_view()
    second = r.compact_bytes_view()
    assert (bytes(first), bytes(second)) == (b"payload", b"xy")
    assert first.obj is data and first.readonly
    assert Reader(b"\xff\xff\xff\xff").nullable_bytes_view() is None
    assert Reader(b"\x00").compact_nullable_bytes_view() is None
    with pytest.raises(DecodeError, match="truncated") as excinfo:
        Reader(b"\x00\x00\x00\x09abc").bytes_view()
    assert excinfo.value.offset == 4


def test_arrays_classic_compact_and_null() -> None:
    buf = bytearray()
    p.write_array(buf, [1, 2], p.write_int32)
    p.write_compact_array(buf, [3], p.write_int32)
    p.write_array(buf, None, p.write_int32)
    p.write_compact_array(buf, None, p.write_int32)
    assert buf.hex() == "0000000200000001000000020200000003ffffffff00"
    r = Reader(buf)
    assert r.array(Reader.int32) == [1, 2]
    assert r.compact_array(Reader.int32) == [3]
    assert r.nullable_array(Reader.int32) is None
    assert r.compact_nullable_array(Reader.int32) is None
    with pytest.raises(DecodeError, match="null"):
        Reader(b"\xff\xff\xff\xff").array(Reader.int32)


def test_absurd_array_lengths_fail_before_allocating() -> None:
    with pytest.raises(DecodeError, match="cannot fit"):
        Reader(b"\x7f\xff\xff\xff").array(Reader.int8)
    r = Reader(b"\x00\x00\x00\x00" + b"\x7f\xff\xff\xff")
    r.int32()
    with pytest.raises(DecodeError) as excinfo:
        r.array_length()
    assert excinfo.value.offset == 4


def test_uuid() -> None:
    value = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")
    data = written(p.write_uuid, value)
    assert data.hex() == "0123456789abcdef0123456789abcdef"
    assert Reader(data).uuid() == value


def test_tagged_fields_raw_round_trip() -> None:
    buf = bytearray()
    p.write_tagged_fields(buf, [(0, b"\x01"), (200, b"")])
    assert buf.hex() == "02000101c80100"
    assert [(tag, bytes(v)) for tag, v in Reader(buf).tagged_fields()] == [(0, b"\x01"), (200, b"")]
    with pytest.raises(ValueError, match="order"):
        p.write_tagged_fields(bytearray(), [(2, b""), (1, b"")])
    with pytest.raises(DecodeError, match="truncated"):
        Reader(bytes.fromhex("01000501")).tagged_fields()


def test_truncated_reads_report_offset() -> None:
    r = Reader(b"\x00\x01\x02")
    r.int8()
    with pytest.raises(DecodeError) as excinfo:
        r.int32()
    assert excinfo.value.offset == 1
    assert "int32" in str(excinfo.value)
    assert r.pos == 1  # a failed read does not move the reader


def test_reader_over_a_window() -> None:
    r = Reader(b"\x00\x00\x00\x01\x00\x00\x00\x02", pos=4, end=8)
    assert r.int32() == 2
    with pytest.raises(DecodeError):
        Reader(b"\x00\x00\x00\x01\x00\x00\x00\x02", pos=2, end=4).int32()
    with pytest.raises(DecodeError, match="trailing"):
        Reader(b"\x00").expect_end()
