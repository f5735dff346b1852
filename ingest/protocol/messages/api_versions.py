"""ApiVersions (api key 18), versions 0-3."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
    BOOL,
    INT16,
    INT32,
    INT64,
    STRING,
    Request,
    Response,
    Struct,
    array,
    spec,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiVersion(Struct):
    api_key: int = spec(INT16, "0+")
    min_version: int = spec(INT16, "0+")
    max_version: int = spec(INT16, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class SupportedFeatureKey(Struct):
    name: str = spec(STRING, "3+")
    min_version: int = spec(INT16, "3+")
    max_version: int = spec(INT16, "3+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FinalizedFeatureKey(Struct):
    name: str = spec(STRING, "3+")
    max_version_level: int = spec(INT16, "3+")
    min_version_level: int = spec(INT16, "3+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiVersionsResponse(Response):
    api_key: ClassVar[int] = 18
    valid_versions: ClassVar[str] = "0-3"
    flexible_versions: ClassVar[str] = "3+"

    error_code: int = spec(INT16, "0+")
    api_keys: tuple[ApiVersion, ...] = spec(array(ApiVersion), "0+")
    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    supported_features: tuple[SupportedFeatureKey, ...] = spec(
        array(SupportedFeatureKey), "3+", tag=0, ignorable=True
    )
    finalized_features_epoch: int = spec(INT64, "3+", tag=1, default=-1, ignorable=True)
    finalized_features: tuple[FinalizedFeatureKey, ...] = spec(
        array(FinalizedFeatureKey), "3+", tag=2, ignorable=True
    )
    zk_migration_ready: bool = spec(BOOL, "3+", tag=3, default=False, ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiVersionsRequest(Request):
    api_key: ClassVar[int] = 18
    valid_versions: ClassVar[str] = "0-3"
    flexible_versions: ClassVar[str] = "3+"
    response_type: ClassVar[type[Response]] = ApiVersionsResponse

    client_software_name: str = spec(STRING, "3+", ignorable=True)
    client_software_version: str = spec(STRING, "3+", ignorable=True)
