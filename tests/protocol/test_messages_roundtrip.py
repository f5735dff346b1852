"""Every message at every version we implement: round trips, schema conformance to
Kafka's JSON definitions, and the encode-time version rules."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from ingest.errors import DecodeError, EncodeError, UnsupportedVersionError
from ingest.protocol import codec
from ingest.protocol.consumer import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from ingest.protocol.messages import (
    REQUESTS,
    EpochEndOffset,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    JoinGroupRequest,
    ListGroupsRequest,
    MetadataRequest,
    PartitionData,
)
from ingest.protocol.schema import ArrayOf, Kind, Message, Request, Response, Struct, struct_fields
from ingest.testing import message_definition
from tests.protocol.protocol_samples import MESSAGE_TYPES, MESSAGE_VERSIONS, sample

SEEDS = range(4)


def _ids(pairs: list[tuple[type[Message], int]]) -> list[str]:
    return [f"{cls.__name__}-v{version}" for cls, version in pairs]


@pytest.mark.parametrize(("cls", "version"), MESSAGE_VERSIONS, ids=_ids(MESSAGE_VERSIONS))
def test_round_trip_every_version(cls: type[Message], version: int) -> None:
    for seed in SEEDS:
        message = sample(cls, version, seed)
        if issubclass(cls, Request):
            frame = codec.encode_request(
                message, version=version, correlation_id=seed, client_id="c"
            )
            header, decoded = codec.decode_request(memoryview(frame)[4:])
            assert (header.request_api_key, header.request_api_version) == (cls.api_key, version)
            assert header.correlation_id == seed
            assert header.client_id == "c"
        else:
            assert issubclass(cls, Response)
            frame = codec.encode_response(message, version=version, correlation_id=seed)
            response_header, decoded = codec.decode_response(
                cls.api_key, version, memoryview(frame)[4:]
            )
            assert response_header.correlation_id == seed
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        assert decoded == message, f"seed {seed}"
        # Re-encoding what we decoded must give the same bytes (nothing lost or reordered).
        if issubclass(cls, Request):
            again = codec.encode_request(
                decoded, version=version, correlation_id=seed, client_id="c"
            )
        else:
            again = codec.encode_response(decoded, version=version, correlation_id=seed)
        assert again == frame


def test_supported_versions_cover_the_brief() -> None:
    expected = {
        18: (0, 3), 3: (1, 12), 10: (1, 4), 11: (2, 9), 14: (1, 5), 12: (1, 4), 13: (1, 5),
        9: (1, 8), 8: (2, 9), 2: (1, 7), 1: (4, 12), 17: (1, 1), 36: (0, 2), 15: (1, 5), 16: (1, 4),
        23: (2, 4), 68: (0, 1), 69: (0, 1),
    }  # fmt: skip
    assert expected == codec.SUPPORTED_VERSIONS
    assert codec.API_NAMES[1] == "Fetch" and codec.API_NAMES[18] == "ApiVersions"
    for api_key, cls in REQUESTS.items():
        assert cls.api_key == cls.response_type.api_key == api_key


def test_records_are_a_zero_copy_slice_of_the_frame() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    response = FetchResponse(
        responses=(
            FetchableTopicResponse(
                topic="t",
                partitions=(PartitionData(partition_index=0, records=payload),),
            ),
        )
    )
    for version in (4, 11, 12):
        frame = bytes(codec.encode_response(response, version=version, correlation_id=1))
        _, decoded = codec.decode_response(1, version, memoryview(frame)[4:])
        assert isinstance(decoded, FetchResponse)
        records = decoded.responses[0].partitions[0].records
        assert isinstance(records, memoryview)
        assert records.obj is frame  # a view into the caller's buffer, not a copy
        assert records.readonly
        assert records == payload


def test_non_default_field_the_version_cannot_carry_is_refused() -> None:
    join = JoinGroupRequest(group_id="g", session_timeout_ms=1, protocol_type="consumer")
    with pytest.raises(EncodeError) as excinfo:
        codec.encode_request(
            JoinGroupRequest(group_id="g", group_instance_id="static-1"),
            version=4,
            correlation_id=1,
            client_id=None,
        )
    assert excinfo.value.field == "JoinGroupRequest.group_instance_id"
    assert "v4" in str(excinfo.value)
    # The default value is fine in the same version.
    codec.encode_request(join, version=4, correlation_id=1, client_id=None)

    with pytest.raises(EncodeError, match="states_filter"):
        codec.encode_request(
            ListGroupsRequest(states_filter=("Stable",)),
            version=3,
            correlation_id=1,
            client_id=None,
        )
    with pytest.raises(EncodeError) as excinfo:
        codec.encode_request(
            MetadataRequest(topics=None, allow_auto_topic_creation=False),
            version=3,
            correlation_id=1,
            client_id=None,
        )
    assert excinfo.value.field == "MetadataRequest.allow_auto_topic_creation"


def test_nested_field_errors_name_the_path() -> None:
    request = FetchRequest(
        topics=(FetchTopic(topic="t", partitions=(FetchPartition(last_fetched_epoch=3),)),)
    )
    with pytest.raises(EncodeError) as excinfo:
        codec.encode_request(request, version=11, correlation_id=1, client_id=None)
    assert excinfo.value.field == "FetchRequest.topics.partitions.last_fetched_epoch"


def test_ignorable_fields_are_dropped_like_kafka_does() -> None:
    request = FetchRequest(rack_id="rack-a", cluster_id="c")  # rack_id is 11+, cluster_id 12+
    frame = codec.encode_request(request, version=10, correlation_id=1, client_id=None)
    _, decoded = codec.decode_request(memoryview(frame)[4:])
    assert decoded == FetchRequest()


def test_null_where_the_version_forbids_it_is_refused() -> None:
    # Metadata topic names become nullable in v10.
    request = MetadataRequest(topics=(codec_topic(None),))
    codec.encode_request(request, version=10, correlation_id=1, client_id=None)
    with pytest.raises(EncodeError, match="null"):
        codec.encode_request(request, version=9, correlation_id=1, client_id=None)


def codec_topic(name: str | None) -> Any:
    from ingest.protocol.messages import MetadataRequestTopic

    return MetadataRequestTopic(name=name)


def test_out_of_range_values_are_refused() -> None:
    with pytest.raises(EncodeError) as excinfo:
        codec.encode_request(
            FetchRequest(max_wait_ms=2**31), version=12, correlation_id=1, client_id=None
        )
    assert excinfo.value.field == "FetchRequest.max_wait_ms"


def test_unsupported_versions_are_refused() -> None:
    with pytest.raises(UnsupportedVersionError):
        codec.encode_request(FetchRequest(), version=13, correlation_id=1, client_id=None)
    with pytest.raises(UnsupportedVersionError):
        codec.decode_response(1, 3, memoryview(b"\x00" * 16))


# -- conformance with Kafka's JSON message definitions --------------------------------


def _kafka_json(name: str) -> dict[str, Any]:
    """Kafka's definition of ``name``, from the kafka-clients jar of the release the test
    harness pins (resolved from Maven Central into the user's cache, never stored here)."""
    text = message_definition(name)
    lines = [line for line in text.splitlines() if not line.strip().startswith("//")]
    return dict(json.loads("\n".join(lines)))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _in(version: int, text: str | None) -> bool:
    if text is None or text == "none":
        return False
    if text.endswith("+"):
        return version >= int(text[:-1])
    if "-" in text:
        low, high = text.split("-")
        return int(low) <= version <= int(high)
    return version == int(text)


_ZERO = {"string": "", "bytes": b"", "records": None, "bool": False, "float64": 0.0}


def _json_default(field: dict[str, Any]) -> Any:
    type_name = field["type"]
    raw = field.get("default")
    if type_name.startswith("[]"):
        return None if raw == "null" else ()
    if raw is None:
        if type_name in _ZERO:
            return _ZERO[type_name]
        if type_name == "uuid":
            import uuid

            return uuid.UUID(int=0)
        if type_name[0].isupper():
            return "struct"
        return 0
    if raw == "null":
        return None
    if isinstance(raw, int):  # a few definitions write a number, not a string
        return raw
    if type_name == "bool":
        return raw == "true"
    if type_name in ("string",):
        return raw
    return int(raw, 0)


def _our_type(kind: Any) -> str:
    if isinstance(kind, Kind):
        return kind.name
    if isinstance(kind, ArrayOf):
        return "[]" + _our_type(kind.element)
    return str(kind.__name__)


# Deliberate, documented differences from Kafka's declared defaults.
DEFAULT_OVERRIDES = {
    ("ListOffsetsRequest", "replica_id"): -1,
    ("OffsetForLeaderEpochRequest", "replica_id"): -1,  # a consumer's; -2 is "unset"
}


def _check_struct(cls: type[Struct], fields: list[dict[str, Any]], version: int, path: str) -> None:
    ours = {name: spec for name, spec in struct_fields(cls)}
    kafka = [f for f in fields if _in(version, f["versions"])]
    kafka_names = [_snake(f["name"]) for f in kafka]
    ours_present = [name for name, spec in ours.items() if version in spec.versions]
    assert ours_present == kafka_names, f"{path} v{version}: field list differs"
    for field in kafka:
        name = _snake(field["name"])
        spec = ours[name]
        where = f"{path}.{name} v{version}"
        assert _our_type(spec.kind) == field["type"], where
        assert (version in spec.nullable) == _in(version, field.get("nullableVersions")), where
        tagged = _in(version, field.get("taggedVersions"))
        assert (version in spec.tagged) == tagged, where
        assert spec.tag == field.get("tag"), where
        assert spec.ignorable == field.get("ignorable", False), where
        assert spec.entity == field.get("entityType"), where
        expected_default = DEFAULT_OVERRIDES.get((cls.__name__, name), _json_default(field))
        if expected_default == "struct":
            assert isinstance(spec.default, Struct), where
        else:
            assert spec.default == expected_default, where
        if "fields" in field:
            element = spec.kind.element if isinstance(spec.kind, ArrayOf) else spec.kind
            assert isinstance(element, type) and issubclass(element, Struct), where
            _check_struct(element, field["fields"], version, f"{path}.{name}")
    # Struct-typed fields declared once in commonStructs are checked where they are used.


def _versions_of(text: str) -> range:
    if text.endswith("+"):
        return range(int(text[:-1]), 100)
    low, _, high = text.partition("-")
    return range(int(low), int(high or low) + 1)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda cls: cls.__name__)
def test_declarations_match_kafka_json(cls: type[Message]) -> None:
    definition = _kafka_json(cls.__name__)
    assert definition["apiKey"] == cls.api_key
    ours = cls.version_range()
    valid = _versions_of(definition["validVersions"])
    assert ours.low in valid and ours.high in valid
    for version in range(ours.low, ours.high + 1):
        assert cls.is_flexible(version) == _in(version, definition["flexibleVersions"])
        _check_struct(cls, definition["fields"], version, cls.__name__)


@pytest.mark.parametrize("cls", [ConsumerProtocolSubscription, ConsumerProtocolAssignment])
def test_consumer_payload_declarations_match_kafka_json(cls: type[Struct]) -> None:
    definition = _kafka_json(cls.__name__)
    assert definition["flexibleVersions"] == "none"
    for version in _versions_of(definition["validVersions"]):
        _check_struct(cls, definition["fields"], version, cls.__name__)


def test_fetch_response_with_many_partitions_decodes_without_copying_records() -> None:
    partitions = tuple(
        PartitionData(partition_index=i, high_watermark=i, records=b"r" * 100) for i in range(100)
    )
    response = FetchResponse(
        responses=tuple(
            FetchableTopicResponse(topic=f"topic-{t}", partitions=partitions) for t in range(10)
        )
    )
    frame = memoryview(codec.encode_response(response, version=12, correlation_id=1))[4:]
    _, decoded = codec.decode_response(1, 12, frame)
    assert decoded == response
    # No per-byte work: every partition's records are a view of the frame (invariant 9).
    views = [p.records for t in decoded.responses for p in t.partitions]
    assert len(views) == 1000
    assert all(isinstance(v, memoryview) and v.obj is frame.obj for v in views)


def test_decode_errors_name_the_field_path_and_offset() -> None:
    response = FetchResponse(
        responses=(
            FetchableTopicResponse(
                topic="t", partitions=(PartitionData(diverging_epoch=EpochEndOffset(epoch=3)),)
            ),
        )
    )
    frame = bytes(codec.encode_response(response, version=12, correlation_id=1))[4:]
    with pytest.raises(DecodeError) as excinfo:
        codec.decode_response(1, 12, memoryview(frame[:-3]))
    assert excinfo.value.field == "FetchResponse.responses.partitions.tagged_fields"
    # Shrink the diverging_epoch tag (tag 0, 12 bytes + tag section) so its int64 is cut short.
    tag_at = frame.index(bytes.fromhex("01000d00000003"))
    shrunk = bytearray(frame)
    shrunk[tag_at + 2] = 0x0B
    with pytest.raises(DecodeError) as excinfo:
        codec.decode_response(1, 12, memoryview(shrunk))
    assert excinfo.value.field == "FetchResponse.responses.partitions.diverging_epoch.end_offset"
    assert excinfo.value.offset == tag_at + 7
    with pytest.raises(DecodeError, match="trailing") as excinfo:
        codec.decode_response(1, 12, memoryview(frame + b"\x00"))
    assert excinfo.value.offset == len(frame)


def test_consumer_group_heartbeat_regex_is_refused_before_v1() -> None:
    from ingest.protocol.messages import ConsumerGroupHeartbeatRequest

    request = ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="m", subscribed_topic_regex="^orders-.*"
    )
    codec.encode_request(request, version=1, correlation_id=1, client_id=None)
    with pytest.raises(EncodeError) as excinfo:
        codec.encode_request(request, version=0, correlation_id=1, client_id=None)
    assert excinfo.value.field == "ConsumerGroupHeartbeatRequest.subscribed_topic_regex"
    assert "v0" in str(excinfo.value)


def test_a_nullable_struct_is_an_int8_marker_then_the_struct() -> None:
    from ingest.protocol.messages import (
        Assignment,
        ConsumerGroupHeartbeatResponse,
        TopicPartitions,
    )

    present = ConsumerGroupHeartbeatResponse(
        member_epoch=3,
        assignment=Assignment(topic_partitions=(TopicPartitions(partitions=(1,)),)),
    )
    absent = ConsumerGroupHeartbeatResponse(member_epoch=3)
    frames = [
        bytes(codec.encode_response(r, version=1, correlation_id=1)) for r in (present, absent)
    ]
    # Same (past the size) up to the marker: 4 + 4 + 1 + 4 + 2 + 1 + 1 + 4 + 4 = 25 bytes in.
    assert frames[0][4:25] == frames[1][4:25]
    assert (frames[0][25], frames[1][25]) == (0x01, 0xFF)
    assert len(frames[1]) == 27  # the marker and the body's tagged fields, nothing else
    # Kafka reads any negative marker as null, any other as a struct.
    other_null = bytearray(frames[1])
    other_null[25] = 0x80
    _, decoded = codec.decode_response(68, 1, memoryview(bytes(other_null))[4:])
    assert decoded == absent
    with pytest.raises(DecodeError):  # a marker, then no struct
        codec.decode_response(68, 1, memoryview(frames[1][:25] + b"\x01\x00")[4:])
