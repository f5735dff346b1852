"""Hostile input: random bytes and mutated valid frames make decoders raise
DecodeError (or succeed), never anything else."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import DecodeError
from ingest.protocol import codec
from ingest.protocol.consumer import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    TopicPartition,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from ingest.protocol.primitives import Reader
from ingest.protocol.schema import Request, Response
from tests.protocol.protocol_samples import MESSAGE_VERSIONS, sample

FUZZ = settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)

RESPONSE_VERSIONS = [(cls, v) for cls, v in MESSAGE_VERSIONS if issubclass(cls, Response)]
REQUEST_VERSIONS = [(cls, v) for cls, v in MESSAGE_VERSIONS if issubclass(cls, Request)]


def _valid_response_body(cls: type[Response], version: int, seed: int) -> bytes:
    frame = codec.encode_response(sample(cls, version, seed), version=version, correlation_id=seed)
    return bytes(frame[4:])


def _valid_request_body(cls: type[Request], version: int, seed: int) -> bytes:
    frame = codec.encode_request(
        sample(cls, version, seed), version=version, correlation_id=seed, client_id="fuzz"
    )
    return bytes(frame[4:])


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few random edits: flips, overwrites, inserts, deletions, truncation."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "int32", "insert", "delete", "truncate"]))
        position = draw(st.integers(0, max(len(out) - 1, 0)))
        if action == "flip" and out:
            out[position] ^= 1 << draw(st.integers(0, 7))
        elif action == "int32":
            value = draw(st.sampled_from([-2, -1, 0, 1, 0x7F, 0x80, 0xFFFF, 2**31 - 1]))
            out[position : position + 4] = (value & 0xFFFFFFFF).to_bytes(4, "big")
        elif action == "insert":
            out[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del out[position : position + draw(st.integers(1, 8))]
        else:
            del out[position:]
    return bytes(out)


def _decodes_or_raises_decode_error(decode: Any, data: bytes) -> None:
    try:
        decode(data)
    except DecodeError as exc:
        assert exc.offset is None or 0 <= exc.offset <= len(data)


@FUZZ
@given(pair=st.sampled_from(RESPONSE_VERSIONS), data=st.binary(max_size=200))
def test_response_decoders_on_random_bytes(pair: tuple[type[Response], int], data: bytes) -> None:
    cls, version = pair
    _decodes_or_raises_decode_error(
        lambda raw: codec.decode_response(cls.api_key, version, memoryview(raw)), data
    )


@FUZZ
@given(pair=st.sampled_from(RESPONSE_VERSIONS), seed=st.integers(0, 3), draw=st.data())
def test_response_decoders_on_mutated_frames(
    pair: tuple[type[Response], int], seed: int, draw: st.DataObject
) -> None:
    cls, version = pair
    data = draw.draw(mutated(_valid_response_body(cls, version, seed)))
    _decodes_or_raises_decode_error(
        lambda raw: codec.decode_response(cls.api_key, version, memoryview(raw)), data
    )


@FUZZ
@given(data=st.binary(max_size=200))
def test_decode_request_on_random_bytes(data: bytes) -> None:
    _decodes_or_raises_decode_error(codec.decode_request, data)


@FUZZ
@given(pair=st.sampled_from(REQUEST_VERSIONS), seed=st.integers(0, 3), draw=st.data())
def test_decode_request_on_mutated_frames(
    pair: tuple[type[Request], int], seed: int, draw: st.DataObject
) -> None:
    cls, version = pair
    data = draw.draw(mutated(_valid_request_body(cls, version, seed)))
    _decodes_or_raises_decode_error(codec.decode_request, data)


_SUBSCRIPTION = encode_subscription(
    ConsumerProtocolSubscription(
        topics=("a", "b"),
        user_data=b"u",
        owned_partitions=(TopicPartition(topic="a", partitions=(0, 1)),),
        generation_id=3,
        rack_id="r",
    )
)
_ASSIGNMENT = encode_assignment(
    ConsumerProtocolAssignment(
        assigned_partitions=(TopicPartition(topic="a", partitions=(2,)),), user_data=None
    )
)


@FUZZ
@given(random=st.binary(max_size=100), draw=st.data())
def test_consumer_protocol_decoders(random: bytes, draw: st.DataObject) -> None:
    for decode, valid in ((decode_subscription, _SUBSCRIPTION), (decode_assignment, _ASSIGNMENT)):
        _decodes_or_raises_decode_error(decode, random)
        _decodes_or_raises_decode_error(decode, draw.draw(mutated(valid)))


READERS = [
    Reader.int8,
    Reader.int16,
    Reader.int32,
    Reader.int64,
    Reader.uint16,
    Reader.uint32,
    Reader.float64,
    Reader.boolean,
    Reader.uuid,
    Reader.uvarint,
    Reader.varint,
    Reader.varlong,
    Reader.string,
    Reader.nullable_string,
    Reader.compact_string,
    Reader.compact_nullable_string,
    Reader.bytes_view,
    Reader.nullable_bytes_view,
    Reader.compact_bytes_view,
    Reader.compact_nullable_bytes_view,
    Reader.array_length,
    Reader.compact_array_length,
    Reader.tagged_fields,
    lambda r: r.array(Reader.string),
    lambda r: r.compact_nullable_array(Reader.compact_string),
]


@FUZZ
@given(data=st.binary(max_size=40))
def test_primitive_readers(data: bytes) -> None:
    for read in READERS:
        _decodes_or_raises_decode_error(lambda raw: read(Reader(raw)), data)  # noqa: B023


HEARTBEAT_VERSIONS = [
    (cls, v) for cls, v in RESPONSE_VERSIONS if cls.__name__ == "ConsumerGroupHeartbeatResponse"
]


@FUZZ
@given(pair=st.sampled_from(HEARTBEAT_VERSIONS), seed=st.integers(0, 7), draw=st.data())
def test_consumer_group_heartbeat_decoder_on_mutated_frames(
    pair: tuple[type[Response], int], seed: int, draw: st.DataObject
) -> None:
    """The consumer-protocol machine's one answer (KIP-848), on its own: DecodeError or a message."""
    cls, version = pair
    data = draw.draw(st.one_of(mutated(_valid_response_body(cls, version, seed)), st.binary()))
    _decodes_or_raises_decode_error(
        lambda raw: codec.decode_response(cls.api_key, version, memoryview(raw)), data
    )
