"""Golden byte vectors written by hand from Kafka's protocol definitions.

Each vector is a small hex listing, one line per field: hex bytes (or a quoted
ASCII string standing for its bytes) followed by ``#`` and what the bytes mean.
The frames include the 4-byte size prefix. We check both directions: our
encoder produces exactly these bytes, and decoding them gives the message.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from ingest.protocol import codec
from ingest.protocol.consumer import decode_assignment, decode_subscription
from ingest.protocol.headers import RequestHeader
from ingest.protocol.messages import (
    AbortedTransaction,
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
    Assignment,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    EpochEndOffsetResult,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ForgottenTopic,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
    MetadataRequest,
    MetadataRequestTopic,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    OffsetForLeaderTopicResult,
    PartitionData,
    SyncGroupResponse,
    TopicPartitions,
)
from ingest.protocol.schema import Request, Response

_TOKEN = re.compile(r'"([^"]*)"|([0-9a-fA-F]+)')


def hexdsl(listing: str) -> bytes:
    """Bytes from a listing of ``hex-or-"ascii" tokens  # comment`` lines."""
    out = bytearray()
    for line in listing.splitlines():
        code = line.split("#", 1)[0]
        for match in _TOKEN.finditer(code):
            text, hex_digits = match.groups()
            if text is not None:
                out += text.encode("ascii")
            else:
                assert len(hex_digits) % 2 == 0, f"odd hex digits in {line!r}"
                out += bytes.fromhex(hex_digits)
        leftover = _TOKEN.sub("", code).strip()
        assert not leftover, f"unparsed {leftover!r} in {line!r}"
    return bytes(out)


def test_hexdsl_reads_hex_strings_and_comments() -> None:
    assert hexdsl('00 0a  # ten\n"ab" ff # text then hex') == b"\x00\x0aab\xff"


# -- requests ---------------------------------------------------------------------

API_VERSIONS_V0_REQUEST = """
0000000e      # frame size 14
0012          # request_api_key 18 (ApiVersions)
0000          # request_api_version 0
00000001      # correlation_id 1
0004 "test"   # client_id: int16 length + bytes (header v1)
              # v0 body is empty
"""

API_VERSIONS_V3_REQUEST = """
0000001d      # frame size 29
0012          # request_api_key 18
0003          # request_api_version 3
00000002      # correlation_id 2
0004 "test"   # client_id stays a classic int16 string in header v2
00            # header tagged fields: none
07 "ingest"   # client_software_name: compact string, varint length+1
06 "0.1.0"    # client_software_version
00            # body tagged fields: none
"""

METADATA_V12_REQUEST = """
0000003d      # frame size 61
0003          # request_api_key 3 (Metadata)
000c          # request_api_version 12
00000003      # correlation_id 3
0004 "test"   # client_id
00            # header tagged fields
03            # topics: compact array of 2
00000000000000000000000000000000  # [0].topic_id: zero uuid (by name)
07 "events"   # [0].name
00            # [0] tagged fields
0102030405060708090a0b0c0d0e0f10  # [1].topic_id
00            # [1].name: null (by id), allowed from v10
00            # [1] tagged fields
00            # allow_auto_topic_creation false
01            # include_topic_authorized_operations true
00            # body tagged fields
"""

JOIN_GROUP_V5_REQUEST = """
0000003e      # frame size 62
000b          # request_api_key 11 (JoinGroup)
0005          # request_api_version 5 (not flexible: header v1)
00000004      # correlation_id 4
0004 "test"   # client_id
0002 "g1"     # group_id
00002710      # session_timeout_ms 10000
0000ea60      # rebalance_timeout_ms 60000
0000          # member_id "" (first join)
0003 "i-1"    # group_instance_id (nullable string, v5+)
0008 "consumer"  # protocol_type
00000001      # protocols: int32 count 1
0005 "range"  # [0].name
00000004 deadbeef  # [0].metadata: int32 length + bytes
"""

FETCH_V12_REQUEST = """
00000069      # frame size 105
0001          # request_api_key 1 (Fetch)
000c          # request_api_version 12
00000005      # correlation_id 5
0004 "test"   # client_id
00            # header tagged fields
ffffffff      # replica_id -1 (a consumer)
000001f4      # max_wait_ms 500
00000001      # min_bytes 1
03200000      # max_bytes 52428800
01            # isolation_level 1 (read_committed)
00000000      # session_id 0
ffffffff      # session_epoch -1 (no session)
02            # topics: compact array of 1
07 "events"   # [0].topic
02            # [0].partitions: compact array of 1
00000003      # partition 3
00000002      # current_leader_epoch 2
000000000000002a  # fetch_offset 42
ffffffff      # last_fetched_epoch -1
ffffffffffffffff  # log_start_offset -1
00100000      # partition_max_bytes 1 MiB
00            # partition tagged fields
00            # topic tagged fields
02            # forgotten_topics_data: compact array of 1
04 "old"      # [0].topic
03 00000000 00000001  # [0].partitions: compact int32 array [0, 1]
00            # forgotten topic tagged fields
01            # rack_id "" (compact: length+1 = 1)
01            # body tagged fields: 1
00 03         # tag 0 (cluster_id), 3 bytes
03 "c1"       # cluster_id "c1" as compact nullable string
"""

OFFSET_COMMIT_V8_REQUEST = """
00000038      # frame size 56
0008          # request_api_key 8 (OffsetCommit)
0008          # request_api_version 8
00000006      # correlation_id 6
0004 "test"   # client_id
00            # header tagged fields
03 "g1"       # group_id
00000007      # generation_id_or_member_epoch 7
04 "m-1"      # member_id
00            # group_instance_id null
02            # topics: compact array of 1
07 "events"   # [0].name
02            # [0].partitions: compact array of 1
00000000      # partition_index 0
0000000000000064  # committed_offset 100
ffffffff      # committed_leader_epoch -1
01            # committed_metadata "" (not null)
00            # partition tagged fields
00            # topic tagged fields
00            # body tagged fields
"""

OFFSET_FOR_LEADER_EPOCH_V4_REQUEST = """
0000002b      # frame size 43
0017          # request_api_key 23 (OffsetForLeaderEpoch)
0004          # request_api_version 4 (flexible: request header v2)
00000007      # correlation_id 7
0004 "test"   # client_id (a plain nullable string even in header v2)
00            # header tagged fields
ffffffff      # replica_id -1 (a consumer)
02            # topics: compact array of 1
07 "events"   # [0].topic (compact: length+1 = 7)
02            # [0].partitions: compact array of 1
00000003      # partition 3
00000005      # current_leader_epoch 5 (fences a stale or unknown epoch)
00000004      # leader_epoch 4 (the epoch whose end offset is asked)
00            # partition tagged fields
00            # topic tagged fields
00            # body tagged fields
"""

# Captured: librdkafka 2.16 to Apache Kafka 4.4 (vectors/confluent_kafka_apache_kafka.json).
CONSUMER_GROUP_HEARTBEAT_V1_REQUEST = """
00000059      # frame size 89
0044          # request_api_key 68 (ConsumerGroupHeartbeat)
0001          # request_api_version 1 (flexible from v0: request header v2)
00000004      # correlation_id 4
0007 "capture"  # client_id
00            # header tagged fields
0e "capture-group"  # group_id (compact: length+1 = 14)
17 "jjLQNx4WTI2gZ9k9l7pp7g"  # member_id: generated by the client (KIP-1082, v1)
00000001      # member_epoch 1
00            # instance_id: null (a dynamic member)
00            # rack_id: null
000493e0      # rebalance_timeout_ms 300000 (every field sent in full)
01            # subscribed_topic_names: compact array of 0
0d "(^captured$)"  # subscribed_topic_regex (v1+)
08 "uniform"  # server_assignor
01            # topic_partitions: compact array of 0 (owns nothing yet)
00            # body tagged fields
"""

# Written by hand: a static member leaving for a restart, at v0.
CONSUMER_GROUP_HEARTBEAT_V0_LEAVE_REQUEST = """
00000024      # frame size 36
0044          # request_api_key 68
0000          # request_api_version 0
00000009      # correlation_id 9
0004 "test"   # client_id
00            # header tagged fields
02 "g"        # group_id
03 "m1"       # member_id
fffffffe      # member_epoch -2: a static member leaving, to come back
03 "i1"       # instance_id
00            # rack_id: null
ffffffff      # rebalance_timeout_ms -1: unchanged
00            # subscribed_topic_names: null (unchanged); v0 has no subscribed_topic_regex
00            # server_assignor: null
00            # topic_partitions: null (unchanged)
00            # body tagged fields
"""

REQUESTS: list[tuple[str, str, int, Request]] = [
    ("ApiVersions v0", API_VERSIONS_V0_REQUEST, 0, ApiVersionsRequest()),
    (
        "ApiVersions v3",
        API_VERSIONS_V3_REQUEST,
        3,
        ApiVersionsRequest(client_software_name="ingest", client_software_version="0.1.0"),
    ),
    (
        "Metadata v12",
        METADATA_V12_REQUEST,
        12,
        MetadataRequest(
            topics=(
                MetadataRequestTopic(name="events"),
                MetadataRequestTopic(topic_id=uuid.UUID(bytes=bytes(range(1, 17))), name=None),
            ),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=True,
        ),
    ),
    (
        "JoinGroup v5",
        JOIN_GROUP_V5_REQUEST,
        5,
        JoinGroupRequest(
            group_id="g1",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=60_000,
            member_id="",
            group_instance_id="i-1",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b"\xde\xad\xbe\xef"),),
        ),
    ),
    (
        "Fetch v12",
        FETCH_V12_REQUEST,
        12,
        FetchRequest(
            cluster_id="c1",
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=52_428_800,
            isolation_level=1,
            topics=(
                FetchTopic(
                    topic="events",
                    partitions=(
                        FetchPartition(
                            partition=3,
                            current_leader_epoch=2,
                            fetch_offset=42,
                            partition_max_bytes=1 << 20,
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(ForgottenTopic(topic="old", partitions=(0, 1)),),
        ),
    ),
    (
        "OffsetCommit v8",
        OFFSET_COMMIT_V8_REQUEST,
        8,
        OffsetCommitRequest(
            group_id="g1",
            generation_id_or_member_epoch=7,
            member_id="m-1",
            topics=(
                OffsetCommitRequestTopic(
                    name="events",
                    partitions=(
                        OffsetCommitRequestPartition(
                            partition_index=0, committed_offset=100, committed_metadata=""
                        ),
                    ),
                ),
            ),
        ),
    ),
    (
        "OffsetForLeaderEpoch v4",
        OFFSET_FOR_LEADER_EPOCH_V4_REQUEST,
        4,
        OffsetForLeaderEpochRequest(
            topics=(
                OffsetForLeaderTopic(
                    topic="events",
                    partitions=(
                        OffsetForLeaderPartition(
                            partition=3, current_leader_epoch=5, leader_epoch=4
                        ),
                    ),
                ),
            ),
        ),
    ),
    (
        "ConsumerGroupHeartbeat v1",
        CONSUMER_GROUP_HEARTBEAT_V1_REQUEST,
        1,
        ConsumerGroupHeartbeatRequest(
            group_id="capture-group",
            member_id="jjLQNx4WTI2gZ9k9l7pp7g",
            member_epoch=1,
            rebalance_timeout_ms=300_000,
            subscribed_topic_names=(),
            subscribed_topic_regex="(^captured$)",
            server_assignor="uniform",
            topic_partitions=(),
        ),
    ),
    (
        "ConsumerGroupHeartbeat v0 static leave",
        CONSUMER_GROUP_HEARTBEAT_V0_LEAVE_REQUEST,
        0,
        ConsumerGroupHeartbeatRequest(
            group_id="g", member_id="m1", member_epoch=-2, instance_id="i1"
        ),
    ),
]


@pytest.mark.parametrize(
    ("listing", "version", "request_"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS]
)
def test_golden_request(listing: str, version: int, request_: Request) -> None:
    frame = hexdsl(listing)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4, "listing's size prefix"
    correlation_id = int.from_bytes(frame[8:12], "big")
    client_id = frame[14 : 14 + int.from_bytes(frame[12:14], "big")].decode()
    encoded = codec.encode_request(
        request_, version=version, correlation_id=correlation_id, client_id=client_id
    )
    assert encoded.hex() == frame.hex()
    header, decoded = codec.decode_request(memoryview(frame)[4:])
    assert header == RequestHeader(
        request_api_key=type(request_).api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    assert decoded == request_


# -- responses --------------------------------------------------------------------

API_VERSIONS_V0_RESPONSE = """
00000016      # frame size 22
00000001      # correlation_id 1 (response header v0)
0000          # error_code 0
00000002      # api_keys: int32 count 2
0012 0000 0003  # ApiVersions 0-3
0001 0004 000c  # Fetch 4-12
"""

API_VERSIONS_V3_RESPONSE = """
00000024      # frame size 36
00000002      # correlation_id 2: ApiVersions keeps response header v0 (no tag section)
0000          # error_code 0
03            # api_keys: compact array of 2
0012 0000 0003 00  # ApiVersions 0-3, tagged fields
0001 0004 000c 00  # Fetch 4-12, tagged fields
00000000      # throttle_time_ms 0
01            # body tagged fields: 1
01 08         # tag 1 (finalized_features_epoch), 8 bytes
0000000000000005  # finalized_features_epoch 5
"""

FETCH_V4_RESPONSE = """
00000070      # frame size 112
00000007      # correlation_id 7
00000000      # throttle_time_ms 0
00000001      # responses: int32 count 1
0006 "events" # [0].topic
00000002      # [0].partitions: count 2
00000000      # partition_index 0
0000          # error_code 0
000000000000000a  # high_watermark 10
000000000000000a  # last_stable_offset 10
00000001      # aborted_transactions: count 1
0000000000000007  # producer_id 7
0000000000000003  # first_offset 3
0000000c 0102030405060708090a0b0c  # records: int32 length + raw batch bytes
00000001      # partition_index 1
0001          # error_code 1 (OFFSET_OUT_OF_RANGE)
ffffffffffffffff  # high_watermark -1
ffffffffffffffff  # last_stable_offset -1
ffffffff      # aborted_transactions: null
ffffffff      # records: null
"""

OFFSET_FOR_LEADER_EPOCH_V4_RESPONSE = """
00000027      # frame size 39
00000007      # correlation_id 7
00            # response header v1 tagged fields
00000000      # throttle_time_ms 0
02            # topics: compact array of 1
07 "events"   # [0].topic
02            # [0].partitions: compact array of 1
0000          # error_code 0
00000003      # partition 3
00000004      # leader_epoch 4 (the largest epoch at or below the one asked)
000000000000002a  # end_offset 42 (the first offset after that epoch)
00            # partition tagged fields
00            # topic tagged fields
00            # body tagged fields
"""

# Captured: Kafka 4.4's answer to the request above, with the assignment (by topic id).
CONSUMER_GROUP_HEARTBEAT_V1_RESPONSE = """
00000051      # frame size 81
00000004      # correlation_id 4
00            # response header v1 tagged fields
00000000      # throttle_time_ms 0
0000          # error_code 0
00            # error_message: null
17 "jjLQNx4WTI2gZ9k9l7pp7g"  # member_id: ours, echoed
00000002      # member_epoch 2
00001388      # heartbeat_interval_ms 5000
01            # assignment: present (a nullable struct's int8 marker; -1 is null)
02            # assignment.topic_partitions: compact array of 1
e02afdfdee4845d58807781a0c9bd660  # [0].topic_id
05 00000000 00000001 00000002 00000003  # [0].partitions: compact int32 array [0, 1, 2, 3]
00            # [0] tagged fields
00            # assignment tagged fields
00            # body tagged fields
"""

# Written by hand: an answer without an assignment (nothing changed), at v0.
CONSUMER_GROUP_HEARTBEAT_V0_RESPONSE = """
00000017      # frame size 23
00000009      # correlation_id 9
00            # response header v1 tagged fields
00000000      # throttle_time_ms 0
006e          # error_code 110 FENCED_MEMBER_EPOCH
00            # error_message: null
00            # member_id: null
ffffffff      # member_epoch -1
00000000      # heartbeat_interval_ms 0
ff            # assignment: null (int8 -1)
00            # body tagged fields
"""

RESPONSES: list[tuple[str, str, int, Response]] = [
    (
        "ConsumerGroupHeartbeat v1",
        CONSUMER_GROUP_HEARTBEAT_V1_RESPONSE,
        1,
        ConsumerGroupHeartbeatResponse(
            member_id="jjLQNx4WTI2gZ9k9l7pp7g",
            member_epoch=2,
            heartbeat_interval_ms=5000,
            assignment=Assignment(
                topic_partitions=(
                    TopicPartitions(
                        topic_id=uuid.UUID("e02afdfd-ee48-45d5-8807-781a0c9bd660"),
                        partitions=(0, 1, 2, 3),
                    ),
                )
            ),
        ),
    ),
    (
        "ConsumerGroupHeartbeat v0",
        CONSUMER_GROUP_HEARTBEAT_V0_RESPONSE,
        0,
        ConsumerGroupHeartbeatResponse(error_code=110, member_epoch=-1),
    ),
    (
        "OffsetForLeaderEpoch v4",
        OFFSET_FOR_LEADER_EPOCH_V4_RESPONSE,
        4,
        OffsetForLeaderEpochResponse(
            topics=(
                OffsetForLeaderTopicResult(
                    topic="events",
                    partitions=(
                        EpochEndOffsetResult(
                            error_code=0, partition=3, leader_epoch=4, end_offset=42
                        ),
                    ),
                ),
            ),
        ),
    ),
    (
        "ApiVersions v0",
        API_VERSIONS_V0_RESPONSE,
        0,
        ApiVersionsResponse(
            api_keys=(
                ApiVersion(api_key=18, min_version=0, max_version=3),
                ApiVersion(api_key=1, min_version=4, max_version=12),
            )
        ),
    ),
    (
        "ApiVersions v3",
        API_VERSIONS_V3_RESPONSE,
        3,
        ApiVersionsResponse(
            api_keys=(
                ApiVersion(api_key=18, min_version=0, max_version=3),
                ApiVersion(api_key=1, min_version=4, max_version=12),
            ),
            finalized_features_epoch=5,
        ),
    ),
    (
        "Fetch v4",
        FETCH_V4_RESPONSE,
        4,
        FetchResponse(
            responses=(
                FetchableTopicResponse(
                    topic="events",
                    partitions=(
                        PartitionData(
                            partition_index=0,
                            high_watermark=10,
                            last_stable_offset=10,
                            aborted_transactions=(
                                AbortedTransaction(producer_id=7, first_offset=3),
                            ),
                            records=bytes(range(1, 13)),
                        ),
                        PartitionData(
                            partition_index=1,
                            error_code=1,
                            high_watermark=-1,
                            last_stable_offset=-1,
                            aborted_transactions=None,
                            records=None,
                        ),
                    ),
                ),
            )
        ),
    ),
]


@pytest.mark.parametrize(
    ("listing", "version", "response"), [r[1:] for r in RESPONSES], ids=[r[0] for r in RESPONSES]
)
def test_golden_response(listing: str, version: int, response: Response) -> None:
    frame = hexdsl(listing)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4, "listing's size prefix"
    correlation_id = int.from_bytes(frame[4:8], "big")
    encoded = codec.encode_response(response, version=version, correlation_id=correlation_id)
    assert encoded.hex() == frame.hex()
    header, decoded = codec.decode_response(type(response).api_key, version, memoryview(frame)[4:])
    assert header.correlation_id == correlation_id
    assert decoded == response


def test_api_versions_v0_error_answer_to_a_v3_request() -> None:
    # A broker that does not know our ApiVersions version answers in v0 with
    # UNSUPPORTED_VERSION and the range it does support.
    frame = hexdsl("""
        0000000a      # frame size 10
        00000009      # correlation_id 9
        0023          # error_code 35 UNSUPPORTED_VERSION
        00000000      # api_keys: empty (int32 count, a v0 body)
    """)
    header, decoded = codec.decode_response(18, 3, memoryview(frame)[4:])
    assert header.correlation_id == 9
    assert decoded == ApiVersionsResponse(error_code=35)
    frame = hexdsl("""
        00000010      # frame size 16
        00000009      # correlation_id 9
        0023          # error_code 35
        00000001      # api_keys: 1
        0012 0000 0002  # ApiVersions 0-2
    """)
    _, decoded = codec.decode_response(18, 3, memoryview(frame)[4:])
    assert decoded == ApiVersionsResponse(
        error_code=35, api_keys=(ApiVersion(api_key=18, min_version=0, max_version=2),)
    )


# -- frames captured from confluent-kafka talking to Tansu (see vectors/README.md) ----

VECTORS = Path(__file__).parent / "vectors"
CAPTURED_TANSU = json.loads((VECTORS / "confluent_kafka_tansu.json").read_text())["exchanges"]
# The consumer protocol (KIP-848) with Apache Kafka 4.4: Tansu does not offer it.
CAPTURED_KAFKA = json.loads((VECTORS / "confluent_kafka_apache_kafka.json").read_text())[
    "exchanges"
]
CAPTURED = [("tansu", e) for e in CAPTURED_TANSU] + [("kafka", e) for e in CAPTURED_KAFKA]


def _names(exchanges: list[dict[str, Any]]) -> set[str]:
    return {f"{codec.API_NAMES[e['api_key']]} v{e['api_version']}" for e in exchanges}


def test_capture_covers_the_consumer_apis() -> None:
    captured = {name.split()[0] for name in _names(CAPTURED_TANSU)}
    needed = {"ApiVersions", "Metadata", "FindCoordinator", "JoinGroup", "SyncGroup"}
    assert needed | {"OffsetFetch", "Fetch"} <= captured
    assert {"ConsumerGroupHeartbeat v1", "OffsetCommit v9", "Fetch v12"} <= _names(CAPTURED_KAFKA)


@pytest.mark.parametrize(
    ("broker", "exchange"),
    CAPTURED,
    ids=[f"{b}-{codec.API_NAMES[e['api_key']]}-v{e['api_version']}" for b, e in CAPTURED],
)
def test_captured_frames(broker: str, exchange: dict[str, Any]) -> None:
    api_key, version = exchange["api_key"], exchange["api_version"]
    request_frame = bytes.fromhex(exchange["request"])
    response_frame = bytes.fromhex(exchange["response"])

    header, request = codec.decode_request(memoryview(request_frame)[4:])
    assert (header.request_api_key, header.request_api_version) == (api_key, version)
    again = codec.encode_request(
        request, version=version, correlation_id=header.correlation_id, client_id=header.client_id
    )
    assert again.hex() == request_frame.hex()

    response_header, response = codec.decode_response(
        api_key, version, memoryview(response_frame)[4:]
    )
    assert response_header.correlation_id == header.correlation_id
    assert isinstance(response, type(request).response_type)
    # Tansu writes some tagged fields even when they hold their defaults, which Kafka
    # (and we) omit, so a response need not re-encode to the same bytes; it must
    # decode again to the same message.
    reencoded = codec.encode_response(response, version=version, correlation_id=1)
    assert codec.decode_response(api_key, version, memoryview(reencoded)[4:])[1] == response

    if isinstance(request, JoinGroupRequest):
        for protocol in request.protocols:
            subscription = decode_subscription(protocol.metadata)
            assert subscription.topics == ("captured",)
    if isinstance(response, JoinGroupResponse):
        for member in response.members:
            assert decode_subscription(member.metadata).topics == ("captured",)
    if isinstance(response, SyncGroupResponse):
        assignment = decode_assignment(response.assignment)
        assert assignment.assigned_partitions[0].topic == "captured"
    if isinstance(response, ConsumerGroupHeartbeatResponse):
        assert response.error_code == 0 and response.member_epoch > 0
        assert isinstance(request, ConsumerGroupHeartbeatRequest)
        assert response.member_id == request.member_id  # v1: the client's own id (KIP-1082)
        assert response.assignment is not None
        assert [t.partitions for t in response.assignment.topic_partitions] == [(0, 1, 2, 3)]
    if isinstance(response, FetchResponse):
        partitions = [p for topic in response.responses for p in topic.partitions]
        assert sum(p.high_watermark for p in partitions) == 20
        for partition in partitions:
            assert isinstance(partition.records, memoryview)
            assert partition.records.obj is response_frame
            if partition.high_watermark:
                # A v2 record batch: magic byte 2 at offset 16.
                assert partition.records[16] == 2
