"""Declarative message schemas; ``struct_codec.py`` is the one engine that encodes and
decodes them.

A message or nested struct is a frozen dataclass deriving from ``Struct``.
Each field's default is ``spec(kind, versions, ...)``, which records what Kafka's
JSON message definitions say about it: the versions it exists in, the versions
where it may be null, its tag when it is a tagged field, whether it is
ignorable and its default. ``StructCodec`` compiles, once per (class, version,
flexible), a list of per-field reader and writer functions, so decoding does no
per-field version checks and no per-byte Python work.

Encoding follows Kafka's rules for fields the chosen version cannot carry: a
default value is fine, an ignorable field is silently dropped, and anything
else raises ``EncodeError`` naming the field and version.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, cast

from ingest.protocol.primitives import ZERO_UUID

__all__ = [
    "BOOL",
    "BYTES",
    "FLOAT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "RECORDS",
    "STRING",
    "UINT16",
    "UUID",
    "ArrayOf",
    "FieldSpec",
    "Kind",
    "Message",
    "Request",
    "Response",
    "Struct",
    "VersionRange",
    "array",
    "spec",
    "struct_fields",
]

MAX_VERSION = 0x7FFF


class VersionRange(NamedTuple):
    """Inclusive range of versions; empty when ``low > high``."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        """Kafka's notation: "3+", "0-4", "5" or "none"."""
        return _parse_versions(text)

    @classmethod
    def _parse(cls, text: str) -> VersionRange:
        text = text.strip()
        if text == "none":
            return cls(1, 0)
        if text.endswith("+"):
            return cls(int(text[:-1]), MAX_VERSION)
        if "-" in text:
            low, high = text.split("-", 1)
            return cls(int(low), int(high))
        return cls(int(text), int(text))

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high

    def __str__(self) -> str:
        if self.low > self.high:
            return "none"
        if self.high == MAX_VERSION:
            return f"{self.low}+"
        return f"{self.low}-{self.high}" if self.low != self.high else str(self.low)


@functools.cache
def _parse_versions(text: str) -> VersionRange:
    return VersionRange._parse(text)


class Kind:
    """A primitive field type; ``zero`` is Kafka's default when none is declared."""

    __slots__ = ("name", "zero")

    def __init__(self, name: str, zero: object) -> None:
        self.name = name
        self.zero = zero

    def __repr__(self) -> str:
        return self.name


INT8 = Kind("int8", 0)
INT16 = Kind("int16", 0)
INT32 = Kind("int32", 0)
INT64 = Kind("int64", 0)
UINT16 = Kind("uint16", 0)
FLOAT64 = Kind("float64", 0.0)
BOOL = Kind("bool", False)
UUID = Kind("uuid", ZERO_UUID)
STRING = Kind("string", "")
BYTES = Kind("bytes", b"")  # decoded as a bytes copy (small payloads)
RECORDS = Kind("records", None)  # decoded as a zero-copy memoryview slice


@dataclass(frozen=True, slots=True)
class ArrayOf:
    element: Kind | type[Struct]

    def __repr__(self) -> str:
        element = self.element
        return f"[]{element.name if isinstance(element, Kind) else element.__name__}"


FieldKind = Kind | ArrayOf | type["Struct"]


def array(element: Kind | type[Struct]) -> ArrayOf:
    return ArrayOf(element)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    kind: FieldKind
    versions: VersionRange
    nullable: VersionRange
    tag: int | None
    tagged: VersionRange
    ignorable: bool
    default: object
    entity: str | None = None


_NONE = VersionRange(1, 0)
_AUTO = object()


def spec(
    kind: FieldKind,
    versions: str,
    *,
    nullable: str = "none",
    tag: int | None = None,
    tagged: str | None = None,
    ignorable: bool = False,
    default: Any = _AUTO,
    entity: str | None = None,
) -> Any:
    """Declare a field (used as the dataclass field default).

    ``entity`` is Kafka's entityType (topicName, groupId, brokerId, producerId):
    no effect on the wire, but it says what a value names.
    """
    if default is _AUTO:
        if isinstance(kind, Kind):
            default = kind.zero
        elif isinstance(kind, ArrayOf):
            default = ()
        else:
            default = kind()
    field_spec = FieldSpec(
        kind=kind,
        versions=VersionRange.parse(versions),
        nullable=VersionRange.parse(nullable),
        tag=tag,
        tagged=VersionRange.parse(tagged if tagged is not None else versions)
        if tag is not None
        else _NONE,
        ignorable=ignorable,
        default=default,
        entity=entity,
    )
    return dataclasses.field(default=default, metadata={"kafka": field_spec})


@dataclass(frozen=True, kw_only=True, slots=True)
class Struct:
    """Base of every message and nested struct.

    ``unknown_tagged_fields`` keeps tagged fields this schema does not know as
    raw (tag, payload) pairs, so that they survive a decode/encode round trip.
    """

    unknown_tagged_fields: tuple[tuple[int, bytes], ...] = dataclasses.field(default=(), repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Message(Struct):
    """A top-level request or response body."""

    api_key: ClassVar[int]
    # The versions we implement (a subset of Kafka's validVersions).
    valid_versions: ClassVar[str]
    flexible_versions: ClassVar[str]

    @classmethod
    def version_range(cls) -> VersionRange:
        return VersionRange.parse(cls.valid_versions)

    @classmethod
    def is_flexible(cls, version: int) -> bool:
        return version in VersionRange.parse(cls.flexible_versions)


@dataclass(frozen=True, kw_only=True, slots=True)
class Response(Message):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class Request(Message):
    response_type: ClassVar[type[Response]]


def struct_fields(cls: type[Struct]) -> list[tuple[str, FieldSpec]]:
    """The declared Kafka fields of a struct class, in wire order."""
    found = []
    for f in dataclasses.fields(cls):
        field_spec = f.metadata.get("kafka")
        if field_spec is not None:
            found.append((f.name, cast(FieldSpec, field_spec)))
    return found
