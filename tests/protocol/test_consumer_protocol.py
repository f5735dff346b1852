"""ConsumerProtocolSubscription / ConsumerProtocolAssignment payloads."""

from __future__ import annotations

import pytest

from ingest.errors import DecodeError, EncodeError
from ingest.protocol.consumer import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    TopicPartition,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

FULL_SUBSCRIPTION = ConsumerProtocolSubscription(
    topics=("orders", "users"),
    user_data=b"\x00\x01",
    owned_partitions=(TopicPartition(topic="orders", partitions=(0, 2)),),
    generation_id=7,
    rack_id="rack-1",
)


def test_subscription_v0_bytes() -> None:
    encoded = encode_subscription(ConsumerProtocolSubscription(topics=("t",)), version=0)
    assert encoded.hex() == "000000000001000174ffffffff"


def test_subscription_v3_bytes() -> None:
    assert encode_subscription(FULL_SUBSCRIPTION, version=3).hex() == (
        "0003"  # version
        "00000002" "0006" "6f7264657273" "0005" "7573657273"  # topics
        "00000002" "0001"  # user_data
        "00000001" "0006" "6f7264657273" "00000002" "00000000" "00000002"  # owned_partitions
        "00000007"  # generation_id
        "0006" "7261636b2d31"  # rack_id
    )  # fmt: skip


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_round_trip(version: int) -> None:
    # Each version keeps the fields it carries; newer fields are ignorable and fall back.
    decoded = decode_subscription(encode_subscription(FULL_SUBSCRIPTION, version=version))
    assert decoded.topics == FULL_SUBSCRIPTION.topics
    assert decoded.user_data == FULL_SUBSCRIPTION.user_data
    assert decoded.owned_partitions == (FULL_SUBSCRIPTION.owned_partitions if version >= 1 else ())
    assert decoded.generation_id == (7 if version >= 2 else -1)
    assert decoded.rack_id == ("rack-1" if version >= 3 else None)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_round_trip(version: int) -> None:
    assignment = ConsumerProtocolAssignment(
        assigned_partitions=(
            TopicPartition(topic="a", partitions=(0, 1, 2)),
            TopicPartition(topic="b", partitions=()),
        ),
        user_data=None,
    )
    encoded = encode_assignment(assignment, version=version)
    assert encoded[:2] == version.to_bytes(2, "big")
    assert decode_assignment(encoded) == assignment


def test_newer_versions_are_read_with_the_fields_we_know() -> None:
    newer = bytearray(encode_subscription(FULL_SUBSCRIPTION, version=3))
    newer[0:2] = (5).to_bytes(2, "big")
    newer += b"\x01\x02\x03"  # fields a future version appends
    assert decode_subscription(newer) == FULL_SUBSCRIPTION
    assignment = bytearray(encode_assignment(ConsumerProtocolAssignment(), version=3))
    assignment[0:2] = (9).to_bytes(2, "big")
    assignment += b"\xff"
    assert decode_assignment(assignment) == ConsumerProtocolAssignment()


def test_known_versions_must_be_exact() -> None:
    with pytest.raises(DecodeError, match="trailing"):
        decode_subscription(encode_subscription(FULL_SUBSCRIPTION, version=3) + b"\x00")
    with pytest.raises(DecodeError, match="invalid"):
        decode_assignment(b"\xff\xff")
    assert decode_assignment(b"") == ConsumerProtocolAssignment()  # member left out by the leader
    with pytest.raises(DecodeError):
        decode_subscription(b"")
    with pytest.raises(DecodeError) as excinfo:
        decode_assignment(b"\x00")
    assert excinfo.value.field == "ConsumerProtocolAssignment.version"
    with pytest.raises(DecodeError) as excinfo:
        decode_subscription(b"\x00\x00\x00\x00\x00\x01\x00\x05ab")
    assert excinfo.value.field == "ConsumerProtocolSubscription.topics"


def test_encoding_an_unknown_version_is_refused() -> None:
    with pytest.raises(EncodeError):
        encode_subscription(FULL_SUBSCRIPTION, version=4)


def test_kafka_python_reads_and_writes_the_same_bytes() -> None:
    metadata = pytest.importorskip("kafka.protocol.consumer.metadata")
    for version in range(4):
        ours = encode_subscription(FULL_SUBSCRIPTION, version=version)
        theirs = metadata.ConsumerProtocolSubscription.decode(ours)
        assert list(theirs.topics) == ["orders", "users"]
        assert bytes(theirs.user_data) == b"\x00\x01"
        assert bytes(theirs.encode(version=version)) == ours
    assignment = ConsumerProtocolAssignment(
        assigned_partitions=(TopicPartition(topic="a", partitions=(3, 4)),), user_data=b"x"
    )
    theirs = metadata.ConsumerProtocolAssignment(
        version=3,
        assigned_partitions=[
            metadata.ConsumerProtocolAssignment.TopicPartition(topic="a", partitions=[3, 4])
        ],
        user_data=b"x",
    )
    assert bytes(theirs.encode()) == encode_assignment(assignment, version=3)
