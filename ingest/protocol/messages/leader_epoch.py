"""OffsetForLeaderEpoch (api key 23), versions 2-4: the end offset of a leader epoch.

A consumer asks it for the epoch of the last record it consumed (the committed leader
epoch) to learn whether the log it resumes in still holds that offset: an end offset
below the position means the log was truncated after an unclean leader change (KIP-320).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
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
class EpochEndOffset(Struct):
    error_code: int = spec(INT16, "0+")
    partition: int = spec(INT32, "0+")
    leader_epoch: int = spec(INT32, "1+", default=-1, ignorable=True)
    end_offset: int = spec(INT64, "0+", default=-1)


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetForLeaderTopicResult(Struct):
    topic: str = spec(STRING, "0+", entity="topicName")
    partitions: tuple[EpochEndOffset, ...] = spec(array(EpochEndOffset), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetForLeaderEpochResponse(Response):
    api_key: ClassVar[int] = 23
    valid_versions: ClassVar[str] = "2-4"
    flexible_versions: ClassVar[str] = "4+"

    throttle_time_ms: int = spec(INT32, "2+", ignorable=True)
    topics: tuple[OffsetForLeaderTopicResult, ...] = spec(array(OffsetForLeaderTopicResult), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetForLeaderPartition(Struct):
    partition: int = spec(INT32, "0+")
    current_leader_epoch: int = spec(INT32, "2+", default=-1, ignorable=True)
    leader_epoch: int = spec(INT32, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetForLeaderTopic(Struct):
    topic: str = spec(STRING, "0+", entity="topicName")
    partitions: tuple[OffsetForLeaderPartition, ...] = spec(array(OffsetForLeaderPartition), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetForLeaderEpochRequest(Request):
    api_key: ClassVar[int] = 23
    valid_versions: ClassVar[str] = "2-4"
    flexible_versions: ClassVar[str] = "4+"
    response_type: ClassVar[type[Response]] = OffsetForLeaderEpochResponse

    # A consumer sends -1 (Kafka's declared default, -2, is "not set", for followers).
    replica_id: int = spec(INT32, "3+", entity="brokerId", default=-1, ignorable=True)
    topics: tuple[OffsetForLeaderTopic, ...] = spec(array(OffsetForLeaderTopic), "0+")
