"""Request header v1/v2 and response header v0/v1.

Flexible request versions use request header v2 (header tagged fields), others
v1. Flexible response versions use response header v1, others v0, except
ApiVersions, whose responses always carry header v0 so that a client that
does not know the broker's versions yet can still read the correlation id.
The client id stays a classic (non-compact) nullable string even in v2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ingest.errors import DecodeError, EncodeError
from ingest.protocol import primitives as p
from ingest.protocol.primitives import Reader

API_VERSIONS_KEY = 18

RawTags = tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestHeader:
    request_api_key: int
    request_api_version: int
    correlation_id: int
    client_id: str | None = None
    unknown_tagged_fields: RawTags = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ResponseHeader:
    correlation_id: int
    unknown_tagged_fields: RawTags = ()


def request_header_version(flexible: bool) -> int:
    return 2 if flexible else 1


def response_header_version(api_key: int, flexible: bool) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if flexible else 0


def _read_raw_tags(r: Reader) -> RawTags:
    # Headers declare no tagged fields of their own: every tag is kept raw.
    return tuple((tag, bytes(payload)) for tag, payload in r.tagged_fields())


def _write_raw_tags(buf: bytearray, tags: RawTags) -> None:
    try:
        p.write_tagged_fields(buf, sorted(tags))
    except (ValueError, TypeError, OverflowError) as exc:
        raise EncodeError(str(exc), field="unknown_tagged_fields") from None


def encode_request_header(buf: bytearray, header: RequestHeader, header_version: int) -> None:
    if header_version not in (1, 2):
        raise EncodeError(f"request header v{header_version} is not supported")
    field = "request_api_key"
    try:
        p.write_int16(buf, header.request_api_key)
        field = "request_api_version"
        p.write_int16(buf, header.request_api_version)
        field = "correlation_id"
        p.write_int32(buf, header.correlation_id)
        field = "client_id"
        p.write_nullable_string(buf, header.client_id)
    except (ValueError, TypeError, OverflowError) as exc:
        raise EncodeError(f"cannot encode request header: {exc}", field=field) from None
    if header_version == 2:
        _write_raw_tags(buf, header.unknown_tagged_fields)
    elif header.unknown_tagged_fields:
        raise EncodeError("request header v1 has no tagged fields", field="unknown_tagged_fields")


def decode_request_header(r: Reader, flexible_for: Callable[[int, int], bool]) -> RequestHeader:
    """Decode a request header; ``flexible_for(api_key, version)`` picks v1 or v2."""
    field = "request_api_key"
    try:
        api_key = r.int16()
        field = "request_api_version"
        api_version = r.int16()
        field = "correlation_id"
        correlation_id = r.int32()
        field = "client_id"
        client_id = r.nullable_string()
        tags: RawTags = ()
        if request_header_version(flexible_for(api_key, api_version)) == 2:
            field = "tagged_fields"
            tags = _read_raw_tags(r)
    except DecodeError as exc:
        where = f"RequestHeader.{exc.field or field}"
        raise DecodeError(exc.reason, offset=exc.offset, field=where) from None
    return RequestHeader(
        request_api_key=api_key,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
        unknown_tagged_fields=tags,
    )


def encode_response_header(buf: bytearray, header: ResponseHeader, header_version: int) -> None:
    try:
        p.write_int32(buf, header.correlation_id)
    except (ValueError, TypeError, OverflowError) as exc:
        raise EncodeError(f"cannot encode: {exc}", field="correlation_id") from None
    if header_version == 1:
        _write_raw_tags(buf, header.unknown_tagged_fields)
    elif header.unknown_tagged_fields:
        raise EncodeError("response header v0 has no tagged fields", field="unknown_tagged_fields")


def decode_response_header(r: Reader, header_version: int) -> ResponseHeader:
    field = "correlation_id"
    try:
        correlation_id = r.int32()
        tags: RawTags = ()
        if header_version == 1:
            field = "tagged_fields"
            tags = _read_raw_tags(r)
    except DecodeError as exc:
        raise DecodeError(exc.reason, offset=exc.offset, field=f"ResponseHeader.{field}") from None
    return ResponseHeader(correlation_id=correlation_id, unknown_tagged_fields=tags)
