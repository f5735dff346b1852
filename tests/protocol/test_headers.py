"""Request and response headers, and which version each API/version uses."""

from __future__ import annotations

import pytest

from ingest.errors import DecodeError, EncodeError
from ingest.protocol import codec
from ingest.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    request_header_version,
    response_header_version,
)
from ingest.protocol.messages import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    MetadataRequest,
)
from ingest.protocol.primitives import Reader


def test_header_versions_follow_flexibility() -> None:
    assert request_header_version(False) == 1
    assert request_header_version(True) == 2
    assert response_header_version(3, False) == 0
    assert response_header_version(3, True) == 1
    # ApiVersions answers with header v0 even in its flexible versions.
    assert response_header_version(18, True) == 0


def test_request_header_v1_and_v2_bytes() -> None:
    header = RequestHeader(
        request_api_key=3, request_api_version=9, correlation_id=258, client_id="ab"
    )
    v1 = bytearray()
    encode_request_header(v1, header, 1)
    assert v1.hex() == "000300090000010200026162"
    v2 = bytearray()
    encode_request_header(v2, header, 2)
    assert v2.hex() == v1.hex() + "00"
    null_client = bytearray()
    encode_request_header(
        null_client, RequestHeader(request_api_key=3, request_api_version=1, correlation_id=1), 1
    )
    assert null_client.hex().endswith("ffff")


def test_request_header_keeps_unknown_tags() -> None:
    header = RequestHeader(
        request_api_key=12,
        request_api_version=4,
        correlation_id=5,
        client_id=None,
        unknown_tagged_fields=((7, b"\x01\x02"),),
    )
    buf = bytearray()
    encode_request_header(buf, header, 2)
    decoded = decode_request_header(Reader(buf), lambda key, version: version >= 4)
    assert decoded == header
    with pytest.raises(EncodeError):
        encode_request_header(bytearray(), header, 1)


def test_response_headers() -> None:
    v0 = bytearray()
    encode_response_header(v0, ResponseHeader(correlation_id=-1), 0)
    assert v0.hex() == "ffffffff"
    v1 = bytearray()
    tagged = ResponseHeader(correlation_id=1, unknown_tagged_fields=((3, b"x"),))
    encode_response_header(v1, tagged, 1)
    assert v1.hex() == "0000000101030178"
    assert decode_response_header(Reader(v1), 1) == tagged
    with pytest.raises(DecodeError) as excinfo:
        decode_response_header(Reader(b"\x00\x00"), 0)
    assert excinfo.value.field == "ResponseHeader.correlation_id"


def test_codec_picks_header_versions() -> None:
    # Heartbeat v3 is not flexible (header v1), v4 is (header v2 with a tag section).
    v3 = codec.encode_request(
        HeartbeatRequest(group_id="g"), version=3, correlation_id=1, client_id="c"
    )
    v4 = codec.encode_request(
        HeartbeatRequest(group_id="g"), version=4, correlation_id=1, client_id="c"
    )
    header_v1 = "000c000300000001000163"
    assert v3.hex()[8:].startswith(header_v1)
    assert v4.hex()[8:].startswith("000c00040000000100016300")
    # Heartbeat v4 responses carry header v1 (correlation id + tag section).
    frame = codec.encode_response(HeartbeatResponse(), version=4, correlation_id=2)
    assert frame.hex() == "0000000c000000020000000000000000"
    # ApiVersions v3: header v2 on the request, header v0 on the response.
    request = codec.encode_request(
        ApiVersionsRequest(), version=3, correlation_id=3, client_id=None
    )
    assert request.hex()[8:] == "0012000300000003ffff00010100"
    response = codec.encode_response(ApiVersionsResponse(), version=3, correlation_id=3)
    assert response.hex() == "0000000c000000030000010000000000"


def test_decode_request_rejects_unknown_api_and_version() -> None:
    frame = codec.encode_request(MetadataRequest(), version=1, correlation_id=1, client_id=None)
    unknown_api = bytearray(frame[4:])
    unknown_api[0:2] = (99).to_bytes(2, "big")
    with pytest.raises(DecodeError, match="unknown api key 99") as excinfo:
        codec.decode_request(unknown_api)
    assert excinfo.value.field == "RequestHeader.request_api_key"
    unknown_version = bytearray(frame[4:])
    unknown_version[2:4] = (0).to_bytes(2, "big")  # Metadata v0 is not implemented
    with pytest.raises(DecodeError, match="Metadata v0"):
        codec.decode_request(unknown_version)
