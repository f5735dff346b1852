"""ListOffsets (api key 2), versions 1-7."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
    INT8,
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

# Special ListOffsets timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
# The record with the largest timestamp (KIP-734): version 7 and later.
MAX_TIMESTAMP = -3
MAX_TIMESTAMP_MIN_VERSION = 7


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOffsetsPartitionResponse(Struct):
    partition_index: int = spec(INT32, "0+")
    error_code: int = spec(INT16, "0+")
    timestamp: int = spec(INT64, "1+", default=-1)
    offset: int = spec(INT64, "1+", default=-1)
    leader_epoch: int = spec(INT32, "4+", default=-1)


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOffsetsTopicResponse(Struct):
    name: str = spec(STRING, "0+", entity="topicName")
    partitions: tuple[ListOffsetsPartitionResponse, ...] = spec(
        array(ListOffsetsPartitionResponse), "0+"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOffsetsResponse(Response):
    api_key: ClassVar[int] = 2
    valid_versions: ClassVar[str] = "1-7"
    flexible_versions: ClassVar[str] = "6+"

    throttle_time_ms: int = spec(INT32, "2+", ignorable=True)
    topics: tuple[ListOffsetsTopicResponse, ...] = spec(array(ListOffsetsTopicResponse), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOffsetsPartition(Struct):
    partition_index: int = spec(INT32, "0+")
    current_leader_epoch: int = spec(INT32, "4+", default=-1, ignorable=True)
    timestamp: int = spec(INT64, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOffsetsTopic(Struct):
    name: str = spec(STRING, "0+", entity="topicName")
    partitions: tuple[ListOffsetsPartition, ...] = spec(array(ListOffsetsPartition), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOffsetsRequest(Request):
    api_key: ClassVar[int] = 2
    valid_versions: ClassVar[str] = "1-7"
    flexible_versions: ClassVar[str] = "6+"
    response_type: ClassVar[type[Response]] = ListOffsetsResponse

    # Kafka declares no default (0); -1 is what every consumer sends.
    replica_id: int = spec(INT32, "0+", entity="brokerId", default=-1)
    isolation_level: int = spec(INT8, "2+")
    topics: tuple[ListOffsetsTopic, ...] = spec(array(ListOffsetsTopic), "0+")
