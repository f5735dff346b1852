"""Public codec API: whole frames in, whole frames out.

Requests are encoded with their 4-byte size prefix so the socket layer can write
them as they are; responses are decoded from a frame WITHOUT that prefix. The
reverse pair (``decode_request``/``encode_response``) serves tests and scripted
peers. Decoding never copies ``records``: it stays a read-only slice of ``frame``
(which it therefore keeps alive).

Decoders raise only ``DecodeError``, whose ``offset`` counts from the start of
``frame`` and whose ``field`` is a dotted path such as
``FetchResponse.responses.partitions.records``. A frame must be consumed exactly:
trailing bytes are an error. Encoders raise ``EncodeError`` for a value the
version cannot carry (Kafka's rule: a non-default value of a field absent from the
version is refused unless Kafka marks the field ignorable, in which case it is
dropped), and ``UnsupportedVersionError`` for a version we do not implement.
"""

from __future__ import annotations

import struct

from ingest.errors import DecodeError, EncodeError, UnsupportedVersionError
from ingest.protocol.headers import (
    API_VERSIONS_KEY,
    RequestHeader,
    ResponseHeader,
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    request_header_version,
    response_header_version,
)
from ingest.protocol.messages import REQUESTS, RESPONSES
from ingest.protocol.primitives import Reader
from ingest.protocol.schema import Request, Response
from ingest.protocol.struct_codec import decode_message, encode_message

__all__ = [
    "API_NAMES",
    "SUPPORTED_VERSIONS",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "is_flexible",
]

_SIZE = struct.Struct(">i")
_UNSUPPORTED_VERSION = 35

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    api_key: (cls.version_range().low, cls.version_range().high)
    for api_key, cls in sorted(REQUESTS.items())
}
API_NAMES: dict[int, str] = {
    api_key: cls.__name__.removesuffix("Request") for api_key, cls in sorted(REQUESTS.items())
}


def _check_version(api_key: int, version: int) -> None:
    supported = SUPPORTED_VERSIONS.get(api_key)
    if supported is None:
        raise UnsupportedVersionError(f"api key {api_key} is not implemented")
    low, high = supported
    if not low <= version <= high:
        raise UnsupportedVersionError(
            f"{API_NAMES[api_key]} v{version} is not implemented (we do {low}-{high})"
        )


def is_flexible(api_key: int, version: int) -> bool:
    """Whether ``api_key`` at ``version`` uses compact encodings and tagged fields."""
    return REQUESTS[api_key].is_flexible(version)


def _patch_size(buf: bytearray) -> bytearray:
    _SIZE.pack_into(buf, 0, len(buf) - 4)
    return buf


def encode_request(
    request: Request, *, version: int, correlation_id: int, client_id: str | None
) -> bytearray:
    """The complete request frame, size prefix included."""
    api_key = type(request).api_key
    _check_version(api_key, version)
    buf = bytearray(4)
    header = RequestHeader(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    encode_request_header(buf, header, request_header_version(is_flexible(api_key, version)))
    encode_message(buf, request, version)
    return _patch_size(buf)


def decode_response(
    api_key: int, version: int, frame: memoryview | bytes | bytearray
) -> tuple[ResponseHeader, Response]:
    """Decode a response frame (size prefix excluded) to the request we sent.

    A broker that does not support our ApiVersions version answers in v0
    (error UNSUPPORTED_VERSION plus its own ranges); that answer is decoded as v0.
    """
    _check_version(api_key, version)
    r = Reader(frame)
    flexible = is_flexible(api_key, version)
    header = decode_response_header(r, response_header_version(api_key, flexible))
    response_type = RESPONSES[api_key]
    body_start = r.pos
    if api_key == API_VERSIONS_KEY and version > 0:
        if r.remaining >= 2 and r.int16() == _UNSUPPORTED_VERSION:
            r.pos = body_start
            return header, _decode_body(response_type, r, 0)
        r.pos = body_start
        try:
            return header, _decode_body(response_type, r, version)
        except DecodeError:
            r.pos = body_start
            try:
                return header, _decode_body(response_type, r, 0)
            except DecodeError:
                pass
            r.pos = body_start
    return header, _decode_body(response_type, r, version)


def _decode_body(response_type: type[Response], r: Reader, version: int) -> Response:
    body = decode_message(response_type, r, version)
    r.expect_end(f"{response_type.__name__} v{version}", field=response_type.__name__)
    return body


def decode_request(frame: memoryview | bytes | bytearray) -> tuple[RequestHeader, Request]:
    """Decode a request frame (size prefix excluded), as a broker would."""
    r = Reader(frame)

    def flexible_for(api_key: int, version: int) -> bool:
        if api_key not in REQUESTS:
            raise DecodeError(f"unknown api key {api_key}", offset=0, field="request_api_key")
        try:
            _check_version(api_key, version)
        except UnsupportedVersionError as exc:
            raise DecodeError(str(exc), offset=2, field="request_api_version") from None
        return is_flexible(api_key, version)

    header = decode_request_header(r, flexible_for)
    request_type = REQUESTS[header.request_api_key]
    body = decode_message(request_type, r, header.request_api_version)
    r.expect_end(
        f"{request_type.__name__} v{header.request_api_version}", field=request_type.__name__
    )
    return header, body


def encode_response(response: Response, *, version: int, correlation_id: int) -> bytearray:
    """The complete response frame, size prefix included, as a broker would send it."""
    api_key = type(response).api_key
    if RESPONSES.get(api_key) is not type(response):
        raise EncodeError(f"{type(response).__name__} is not a known response type")
    _check_version(api_key, version)
    buf = bytearray(4)
    header_version = response_header_version(api_key, is_flexible(api_key, version))
    encode_response_header(buf, ResponseHeader(correlation_id=correlation_id), header_version)
    encode_message(buf, response, version)
    return _patch_size(buf)
