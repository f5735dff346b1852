"""Consumer-group protocol payloads (the "consumer" protocol type).

JoinGroup carries a ConsumerProtocolSubscription as each protocol's metadata;
SyncGroup carries a ConsumerProtocolAssignment as each member's assignment.
Both start with an int16 version. As in Kafka, a decoder that meets a newer
version than it knows reads the fields it knows and ignores the rest, since
later versions only append fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

from ingest.errors import DecodeError, EncodeError
from ingest.protocol import primitives as p
from ingest.protocol.primitives import Reader
from ingest.protocol.schema import BYTES, INT32, STRING, Struct, array, spec
from ingest.protocol.struct_codec import codec_for

__all__ = [
    "ASSIGNMENT_VERSIONS",
    "SUBSCRIPTION_VERSIONS",
    "ConsumerProtocolAssignment",
    "ConsumerProtocolSubscription",
    "TopicPartition",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

S = TypeVar("S", bound=Struct)

SUBSCRIPTION_VERSIONS = (0, 3)
ASSIGNMENT_VERSIONS = (0, 3)


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicPartition(Struct):
    topic: str = spec(STRING, "0+", entity="topicName")
    partitions: tuple[int, ...] = spec(array(INT32), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerProtocolSubscription(Struct):
    topics: tuple[str, ...] = spec(array(STRING), "0+")
    user_data: bytes | None = spec(BYTES, "0+", nullable="0+", default=None)
    owned_partitions: tuple[TopicPartition, ...] = spec(array(TopicPartition), "1+", ignorable=True)
    generation_id: int = spec(INT32, "2+", default=-1, ignorable=True)
    rack_id: str | None = spec(STRING, "3+", nullable="3+", default=None, ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerProtocolAssignment(Struct):
    assigned_partitions: tuple[TopicPartition, ...] = spec(array(TopicPartition), "0+")
    user_data: bytes | None = spec(BYTES, "0+", nullable="0+", default=None)


def _encode(payload: Struct, version: int, known: tuple[int, int]) -> bytes:
    low, high = known
    name = type(payload).__name__
    if not low <= version <= high:
        raise EncodeError(f"{name} has versions {low}-{high}, not {version}")
    buf = bytearray()
    p.write_int16(buf, version)
    try:
        codec_for(type(payload), version, False).encode_into(buf, payload)
    except EncodeError as exc:
        raise EncodeError(exc.reason, field=f"{name}.{exc.field}" if exc.field else name) from None
    return bytes(buf)


def _decode(cls: type[S], data: bytes | bytearray | memoryview, known: tuple[int, int]) -> S:
    r = Reader(data)
    try:
        version = r.int16()
    except DecodeError as exc:
        raise DecodeError(exc.reason, offset=exc.offset, field=f"{cls.__name__}.version") from None
    if version < known[0]:
        raise DecodeError(f"{cls.__name__} version {version} is invalid", offset=0, field="version")
    # Kafka reads a newer payload with its newest schema and ignores what follows.
    readable = min(version, known[1])
    try:
        payload = codec_for(cls, readable, False).decode(r)
    except DecodeError as exc:
        field = f"{cls.__name__}.{exc.field}" if exc.field else cls.__name__
        raise DecodeError(exc.reason, offset=exc.offset, field=field) from None
    if version <= known[1]:
        r.expect_end(f"{cls.__name__} v{version}")
    return cast(S, payload)


def encode_subscription(subscription: ConsumerProtocolSubscription, version: int = 3) -> bytes:
    return _encode(subscription, version, SUBSCRIPTION_VERSIONS)


def decode_subscription(data: bytes | bytearray | memoryview) -> ConsumerProtocolSubscription:
    return _decode(ConsumerProtocolSubscription, data, SUBSCRIPTION_VERSIONS)


def encode_assignment(assignment: ConsumerProtocolAssignment, version: int = 3) -> bytes:
    return _encode(assignment, version, ASSIGNMENT_VERSIONS)


def decode_assignment(data: bytes | bytearray | memoryview) -> ConsumerProtocolAssignment:
    """Decode a SyncGroup assignment.

    Empty bytes, which the coordinator hands to a member the leader assigned
    nothing, decode as an empty assignment.
    """
    if len(data) == 0:
        return ConsumerProtocolAssignment()
    return _decode(ConsumerProtocolAssignment, data, ASSIGNMENT_VERSIONS)
