"""Record-batch compression codecs: none, gzip, snappy, lz4 and zstd, through pyarrow.

Decompression is always bounded: ``decompress`` never produces more than
``max_size`` bytes, whatever the input claims, so a hostile batch (a zip bomb,
or a snappy preamble declaring 4 GiB) costs at most ``max_size`` of memory and
is reported as corrupt. gzip, lz4 (frame format, as Kafka uses since magic v1)
and zstd stream through ``pyarrow.CompressedInputStream`` in growing chunks;
snappy declares its size up front (raw) or per 32 KiB chunk (xerial framing,
as the Java client writes it), which is checked before anything is allocated.

Every failure raises ``DecodeError``; the records decoder turns it into a
corrupt-batch report.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Literal, TypeAlias, cast

import pyarrow as pa

from ingest.errors import DecodeError, EncodeError

BytesLike: TypeAlias = bytes | bytearray | memoryview | pa.Buffer


class Codec(IntEnum):
    """The compression type in bits 0-2 of a batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


CodecName = Literal["none", "gzip", "snappy", "lz4", "zstd"]

# pyarrow's names for the streaming codecs.
_STREAM_CODECS = {Codec.GZIP: "gzip", Codec.LZ4: "lz4", Codec.ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_CHUNK = 32 * 1024  # the Java client's default block size
_INT32 = struct.Struct(">i")

# Start a streaming read at this many bytes (or 8x the input) and double.
_FIRST_READ = 64 * 1024


def codec_from_name(name: str | int) -> Codec:
    """A Codec from its Kafka name ("none", "gzip", ...) or number."""
    if isinstance(name, int):
        return Codec(name)
    try:
        return Codec[name.upper()]
    except KeyError:
        raise ValueError(f"unknown compression codec {name!r}") from None


def decompress(codec: Codec | int, data: BytesLike, *, max_size: int) -> BytesLike:
    """Decompresses one batch's records; at most ``max_size`` bytes come out."""
    codec = Codec(codec)
    if codec == Codec.NONE:
        if len(data) > max_size:
            raise DecodeError(f"records exceed {max_size} bytes", field="records")
        return data
    if codec == Codec.SNAPPY:
        return _snappy_decompress(data, max_size)
    return _stream_decompress(_STREAM_CODECS[codec], data, max_size)


def _stream_decompress(name: str, data: BytesLike, max_size: int) -> BytesLike:
    try:
        stream = pa.CompressedInputStream(pa.BufferReader(pa.py_buffer(data)), name)
        chunks: list[pa.Buffer] = []
        allowed = max_size + 1  # one byte past the cap proves the cap was exceeded
        want = min(allowed, max(_FIRST_READ, 8 * len(data)))
        while True:
            chunk = stream.read_buffer(want)
            if chunk.size:
                chunks.append(chunk)
                allowed -= chunk.size
            if chunk.size < want:
                break
            if allowed <= 0:
                raise DecodeError(
                    f"{name} batch decompresses to more than {max_size} bytes", field="records"
                )
            want = min(allowed, want * 2)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DecodeError(f"{name} decompression failed: {exc}", field="records") from None
    if len(chunks) == 1:
        return cast(BytesLike, chunks[0])
    return b"".join(chunks)


def _read_uvarint32(data: memoryview) -> int:
    """Snappy's preamble: the uncompressed length as an unsigned LEB128 (<= 32 bits)."""
    value = 0
    for index in range(min(len(data), 5)):
        byte = data[index]
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            if value > 0xFFFFFFFF:
                break
            return value
    raise DecodeError("bad snappy length preamble", field="records")


def _snappy_block(block: memoryview, budget: int, max_size: int) -> pa.Buffer:
    size = _read_uvarint32(block)
    if size > budget:
        raise DecodeError(
            f"snappy batch declares more than the {max_size} bytes allowed", field="records"
        )
    try:
        return pa.Codec("snappy").decompress(block, decompressed_size=size)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DecodeError(f"snappy decompression failed: {exc}", field="records") from None


def _snappy_decompress(data: BytesLike, max_size: int) -> BytesLike:
    view = memoryview(data).cast("B")
    if bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _snappy_block(view, max_size, max_size)
    if len(view) < _XERIAL_HEADER.size:
        raise DecodeError("truncated xerial snappy header", field="records")
    pos = _XERIAL_HEADER.size
    budget = max_size
    blocks: list[pa.Buffer] = []
    while pos < len(view):
        if len(view) - pos < 4:
            raise DecodeError("truncated xerial snappy chunk length", field="records")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or length > len(view) - pos:
            raise DecodeError("xerial snappy chunk runs past the batch", field="records")
        block = _snappy_block(view[pos : pos + length], budget, max_size)
        budget -= block.size
        blocks.append(block)
        pos += length
    if len(blocks) == 1:
        return cast(BytesLike, blocks[0])
    return b"".join(blocks)


def compress(
    codec: Codec | int | str,
    data: BytesLike,
    *,
    snappy_framing: Literal["xerial", "raw"] = "xerial",
    level: int | None = None,
) -> bytes:
    """Compresses records the way Kafka producers do (for tests and scripted peers)."""
    kind = codec_from_name(codec) if isinstance(codec, str) else Codec(codec)
    if kind == Codec.NONE:
        return bytes(data)
    if kind == Codec.SNAPPY:
        snappy = pa.Codec("snappy")
        if snappy_framing == "raw":
            return bytes(snappy.compress(data, asbytes=True))
        out = bytearray(_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1))
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _XERIAL_CHUNK):
            block = snappy.compress(view[start : start + _XERIAL_CHUNK], asbytes=True)
            out += _INT32.pack(len(block))
            out += block
        return bytes(out)
    try:
        arrow_codec = pa.Codec(_STREAM_CODECS[kind], compression_level=level)
        return bytes(arrow_codec.compress(data, asbytes=True))
    except (pa.ArrowException, ValueError) as exc:
        raise EncodeError(f"{kind.name.lower()} compression failed: {exc}") from None
