"""The one engine that encodes and decodes every schema of ``schema.py``.

``StructCodec`` compiles, once per (class, version, flexible), a list of per-field reader
and writer functions, so decoding does no per-field version checks and no per-byte Python
work. Encoding follows Kafka's rules for fields the chosen version cannot carry: a default
value is fine, an ignorable field is silently dropped, and anything else raises
``EncodeError`` naming the field and version.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from ingest.errors import DecodeError, EncodeError, UnsupportedVersionError
from ingest.protocol import primitives as p
from ingest.protocol.primitives import Reader
from ingest.protocol.schema import (
    ArrayOf,
    FieldKind,
    Kind,
    Message,
    Struct,
    struct_fields,
)

__all__ = ["StructCodec", "codec_for", "decode_message", "encode_message"]

Decoder = Callable[[Reader], Any]
Writer = Callable[[bytearray, Any], None]
S = TypeVar("S", bound=Struct)


def _bytes_copy(reader_method: Callable[[Reader], memoryview]) -> Decoder:
    def decode(r: Reader) -> bytes:
        return bytes(reader_method(r))

    return decode


def _nullable_bytes_copy(reader_method: Callable[[Reader], memoryview | None]) -> Decoder:
    def decode(r: Reader) -> bytes | None:
        view = reader_method(r)
        return None if view is None else bytes(view)

    return decode


_FIXED_READERS: dict[str, Decoder] = {
    "int8": Reader.int8,
    "int16": Reader.int16,
    "int32": Reader.int32,
    "int64": Reader.int64,
    "uint16": Reader.uint16,
    "float64": Reader.float64,
    "bool": Reader.boolean,
    "uuid": Reader.uuid,
}

_FIXED_WRITERS: dict[str, Writer] = {
    "int8": p.write_int8,
    "int16": p.write_int16,
    "int32": p.write_int32,
    "int64": p.write_int64,
    "uint16": p.write_uint16,
    "float64": p.write_float64,
    "bool": p.write_boolean,
    "uuid": p.write_uuid,
}

# (kind name, compact, nullable) -> reader / writer
_VARIABLE_READERS: dict[tuple[str, bool, bool], Decoder] = {
    ("string", False, False): Reader.string,
    ("string", False, True): Reader.nullable_string,
    ("string", True, False): Reader.compact_string,
    ("string", True, True): Reader.compact_nullable_string,
    ("bytes", False, False): _bytes_copy(Reader.bytes_view),
    ("bytes", False, True): _nullable_bytes_copy(Reader.nullable_bytes_view),
    ("bytes", True, False): _bytes_copy(Reader.compact_bytes_view),
    ("bytes", True, True): _nullable_bytes_copy(Reader.compact_nullable_bytes_view),
    ("records", False, False): Reader.bytes_view,
    ("records", False, True): Reader.nullable_bytes_view,
    ("records", True, False): Reader.compact_bytes_view,
    ("records", True, True): Reader.compact_nullable_bytes_view,
}

_VARIABLE_WRITERS: dict[tuple[str, bool, bool], Writer] = {
    ("string", False, False): p.write_string,
    ("string", False, True): p.write_nullable_string,
    ("string", True, False): p.write_compact_string,
    ("string", True, True): p.write_compact_nullable_string,
    ("bytes", False, False): p.write_bytes,
    ("bytes", False, True): p.write_nullable_bytes,
    ("bytes", True, False): p.write_compact_bytes,
    ("bytes", True, True): p.write_compact_nullable_bytes,
    ("records", False, False): p.write_bytes,
    ("records", False, True): p.write_nullable_bytes,
    ("records", True, False): p.write_compact_bytes,
    ("records", True, True): p.write_compact_nullable_bytes,
}


def _array_reader(element: Decoder, flexible: bool, nullable: bool) -> Decoder:
    length = Reader.compact_array_length if flexible else Reader.array_length

    def decode(r: Reader) -> tuple[Any, ...] | None:
        start = r.pos
        count = length(r)
        if count < 0:
            if nullable:
                return None
            raise DecodeError("null in a non-nullable array", offset=start)
        return tuple([element(r) for _ in range(count)])

    return decode


def _array_writer(element: Writer, flexible: bool, nullable: bool) -> Writer:
    write_length = p.write_compact_array_length if flexible else p.write_array_length

    def encode(buf: bytearray, items: Sequence[Any] | None) -> None:
        if items is None:
            if not nullable:
                raise TypeError("null in a non-nullable array")
            write_length(buf, None)
            return
        if not isinstance(items, tuple | list):
            raise TypeError(f"expected a tuple, got {type(items).__name__}")
        write_length(buf, len(items))
        for item in items:
            element(buf, item)

    return encode


def _reader_for(kind: FieldKind, version: int, flexible: bool, nullable: bool) -> Decoder:
    if isinstance(kind, Kind):
        fixed = _FIXED_READERS.get(kind.name)
        if fixed is not None:
            return fixed
        return _VARIABLE_READERS[(kind.name, flexible, nullable)]
    if isinstance(kind, ArrayOf):
        element = _reader_for(kind.element, version, flexible, False)
        return _array_reader(element, flexible, nullable)
    decode = codec_for(kind, version, flexible).decode
    return _nullable_struct_reader(decode) if nullable else decode


def _writer_for(kind: FieldKind, version: int, flexible: bool, nullable: bool) -> Writer:
    if isinstance(kind, Kind):
        fixed = _FIXED_WRITERS.get(kind.name)
        if fixed is not None:
            return fixed
        return _VARIABLE_WRITERS[(kind.name, flexible, nullable)]
    if isinstance(kind, ArrayOf):
        element = _writer_for(kind.element, version, flexible, False)
        return _array_writer(element, flexible, nullable)
    encode = codec_for(kind, version, flexible).encode_into
    return _nullable_struct_writer(encode) if nullable else encode


def _nullable_struct_reader(decode: Decoder) -> Decoder:
    """A nullable struct, as Kafka writes one: an int8 marker (negative: null), then the struct."""

    def read(r: Reader) -> Any:
        return None if r.int8() < 0 else decode(r)

    return read


def _nullable_struct_writer(encode: Writer) -> Writer:
    def write(buf: bytearray, value: Any) -> None:
        if value is None:
            p.write_int8(buf, -1)
            return
        p.write_int8(buf, 1)
        encode(buf, value)

    return write


def _prefixed_decode_error(exc: DecodeError, name: str | None) -> DecodeError:
    if name is None:
        return exc
    field = f"{name}.{exc.field}" if exc.field else name
    return DecodeError(exc.reason, offset=exc.offset, field=field)


def _prefixed_encode_error(exc: EncodeError, name: str | None) -> EncodeError:
    if name is None:
        return exc
    field = f"{name}.{exc.field}" if exc.field else name
    return EncodeError(exc.reason, offset=exc.offset, field=field)


class _Absent(NamedTuple):
    name: str
    default: object
    ignorable: bool


class _Tagged(NamedTuple):
    tag: int
    name: str
    default: object
    decode: Decoder
    encode: Writer


class StructCodec:
    """Encoder and decoder of one struct class at one version."""

    __slots__ = (
        "_absent",
        "_defaults",
        "_regular_readers",
        "_regular_writers",
        "_tagged",
        "_tagged_by_tag",
        "cls",
        "flexible",
        "version",
    )

    def __init__(self, cls: type[Struct], version: int, flexible: bool) -> None:
        self.cls = cls
        self.version = version
        self.flexible = flexible
        self._regular_readers: list[tuple[str, Decoder]] = []
        self._regular_writers: list[tuple[str, Writer, bool]] = []
        self._absent: list[_Absent] = []
        self._tagged: list[_Tagged] = []
        self._defaults: dict[str, object] = {}
        for field_name, field_spec in struct_fields(cls):
            if version not in field_spec.versions:
                self._absent.append(_Absent(field_name, field_spec.default, field_spec.ignorable))
                self._defaults[field_name] = field_spec.default
                continue
            nullable = version in field_spec.nullable
            decode = _reader_for(field_spec.kind, version, flexible, nullable)
            encode = _writer_for(field_spec.kind, version, flexible, nullable)
            if field_spec.tag is not None and version in field_spec.tagged:
                if not flexible:
                    raise TypeError(
                        f"{cls.__name__}.{field_name}: tagged in a non-flexible version"
                    )
                self._defaults[field_name] = field_spec.default
                self._tagged.append(
                    _Tagged(field_spec.tag, field_name, field_spec.default, decode, encode)
                )
            else:
                self._regular_readers.append((field_name, decode))
                self._regular_writers.append((field_name, encode, nullable))
        self._tagged.sort(key=lambda entry: entry.tag)
        self._tagged_by_tag = {entry.tag: entry for entry in self._tagged}

    # -- decoding ----------------------------------------------------------------

    def decode(self, r: Reader) -> Any:
        values: dict[str, Any] = self._defaults.copy()
        name: str | None = None
        try:
            for name, decode in self._regular_readers:
                values[name] = decode(r)
            if self.flexible:
                name = "tagged_fields"
                unknown = self._read_tagged(r, values)
                if unknown:
                    values["unknown_tagged_fields"] = unknown
        except DecodeError as exc:
            if name == "tagged_fields" and exc.field is not None:
                raise  # a known tagged field: it already names itself
            raise _prefixed_decode_error(exc, name) from None
        return self.cls(**values)

    def _read_tagged(self, r: Reader, values: dict[str, Any]) -> tuple[tuple[int, bytes], ...]:
        start = r.pos
        count = r.uvarint()
        if count * 2 > r.remaining:
            raise DecodeError(f"{count} tagged fields cannot fit", offset=start)
        unknown: list[tuple[int, bytes]] = []
        for _ in range(count):
            tag = r.uvarint()
            size = r.uvarint()
            sub = r.sub_reader(size, f"tagged field {tag}")
            entry = self._tagged_by_tag.get(tag)
            if entry is None:
                unknown.append((tag, bytes(sub.buf[sub.pos : sub.end])))
                continue
            try:
                values[entry.name] = entry.decode(sub)
                sub.expect_end(f"tagged field {tag}")
            except DecodeError as exc:
                raise _prefixed_decode_error(exc, entry.name) from None
        return tuple(unknown)

    # -- encoding ----------------------------------------------------------------

    def encode_into(self, buf: bytearray, obj: Any) -> None:
        if type(obj) is not self.cls:
            raise EncodeError(
                f"expected {self.cls.__name__}, got {type(obj).__name__}",
            )
        name: str | None = None
        try:
            for name, encode, nullable in self._regular_writers:
                value = getattr(obj, name)
                if value is None and not nullable:
                    raise EncodeError(f"null is not allowed in {self.cls.__name__} v{self.version}")
                encode(buf, value)
            for absent in self._absent:
                name = absent.name
                value = getattr(obj, name)
                if not absent.ignorable and value != absent.default:
                    raise EncodeError(
                        f"{self.cls.__name__} v{self.version} cannot carry a non-default "
                        f"value {value!r}"
                    )
            name = None
            unknown: tuple[tuple[int, bytes], ...] = obj.unknown_tagged_fields
            if self.flexible:
                self._write_tagged(buf, obj, unknown)
            elif unknown:
                name = "unknown_tagged_fields"
                raise EncodeError(f"{self.cls.__name__} v{self.version} is not flexible")
        except EncodeError as exc:
            raise _prefixed_encode_error(exc, name) from None
        except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise EncodeError(
                f"cannot encode in {self.cls.__name__} v{self.version}: {exc}", field=name
            ) from None

    def _write_tagged(
        self, buf: bytearray, obj: Any, unknown: tuple[tuple[int, bytes], ...]
    ) -> None:
        fields: list[tuple[int, p.BytesLike]] = []
        for entry in self._tagged:
            value = getattr(obj, entry.name)
            if value == entry.default:
                continue
            payload = bytearray()
            try:
                entry.encode(payload, value)
            except EncodeError as exc:
                raise _prefixed_encode_error(exc, entry.name) from None
            except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise EncodeError(f"cannot encode: {exc}", field=entry.name) from None
            fields.append((entry.tag, payload))
        if unknown:
            known = {tag for tag, _ in fields}
            for tag, raw in unknown:
                if tag in known or tag in self._tagged_by_tag:
                    raise EncodeError(
                        f"unknown tagged field reuses the known tag {tag}",
                        field="unknown_tagged_fields",
                    )
                known.add(tag)
                fields.append((tag, raw))
            fields.sort(key=lambda item: item[0])
        p.write_tagged_fields(buf, fields)


_CODECS: dict[tuple[type[Struct], int, bool], StructCodec] = {}


def codec_for(cls: type[Struct], version: int, flexible: bool) -> StructCodec:
    key = (cls, version, flexible)
    codec = _CODECS.get(key)
    if codec is None:
        codec = StructCodec(cls, version, flexible)
        _CODECS[key] = codec
    return codec


_MESSAGE_CODECS: dict[tuple[type[Message], int], StructCodec] = {}


def _message_codec(cls: type[Message], version: int) -> StructCodec:
    codec = _MESSAGE_CODECS.get((cls, version))
    if codec is None:
        if version not in cls.version_range():
            raise UnsupportedVersionError(
                f"{cls.__name__} supports versions {cls.valid_versions}, not {version}"
            )
        codec = codec_for(cls, version, cls.is_flexible(version))
        _MESSAGE_CODECS[(cls, version)] = codec
    return codec


def encode_message(buf: bytearray, message: Message, version: int) -> None:
    """Append the body of ``message`` at ``version`` to ``buf``."""
    codec = _message_codec(type(message), version)
    try:
        codec.encode_into(buf, message)
    except EncodeError as exc:
        field = f"{type(message).__name__}.{exc.field}" if exc.field else type(message).__name__
        raise EncodeError(exc.reason, field=field) from None


def decode_message(cls: type[S], r: Reader, version: int) -> S:
    """Decode one ``cls`` body at ``version`` from ``r`` (which it advances)."""
    if not issubclass(cls, Message):
        raise TypeError(f"{cls.__name__} is not a message")
    codec = _message_codec(cls, version)
    try:
        return cast(S, codec.decode(r))
    except DecodeError as exc:
        field = f"{cls.__name__}.{exc.field}" if exc.field else cls.__name__
        raise DecodeError(exc.reason, offset=exc.offset, field=field) from None
