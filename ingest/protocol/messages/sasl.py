"""SaslHandshake (api key 17) v1 and SaslAuthenticate (api key 36) v0-2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import BYTES, INT16, INT64, STRING, Request, Response, array, spec


@dataclass(frozen=True, kw_only=True, slots=True)
class SaslHandshakeResponse(Response):
    api_key: ClassVar[int] = 17
    valid_versions: ClassVar[str] = "1"
    flexible_versions: ClassVar[str] = "none"

    error_code: int = spec(INT16, "0+")
    mechanisms: tuple[str, ...] = spec(array(STRING), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class SaslHandshakeRequest(Request):
    api_key: ClassVar[int] = 17
    valid_versions: ClassVar[str] = "1"
    flexible_versions: ClassVar[str] = "none"
    response_type: ClassVar[type[Response]] = SaslHandshakeResponse

    mechanism: str = spec(STRING, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class SaslAuthenticateResponse(Response):
    api_key: ClassVar[int] = 36
    valid_versions: ClassVar[str] = "0-2"
    flexible_versions: ClassVar[str] = "2+"

    error_code: int = spec(INT16, "0+")
    error_message: str | None = spec(STRING, "0+", nullable="0+")
    auth_bytes: bytes = spec(BYTES, "0+")
    session_lifetime_ms: int = spec(INT64, "1+", default=0, ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class SaslAuthenticateRequest(Request):
    api_key: ClassVar[int] = 36
    valid_versions: ClassVar[str] = "0-2"
    flexible_versions: ClassVar[str] = "2+"
    response_type: ClassVar[type[Response]] = SaslAuthenticateResponse

    auth_bytes: bytes = spec(BYTES, "0+")
